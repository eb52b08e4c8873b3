"""Starting a run: how a resume is reported (start_run's services are tested through `Trainer.fit`)."""

import pytest

from tftrain.loops import run_setup


@pytest.mark.parametrize("verbose", [0, 1])
def test_resume_message_is_logged_and_printed_unless_silent(verbose, capsys, caplog):
    with caplog.at_level("INFO", logger="tftrain"):
        run_setup.report_resume("tftrain: resumed from x at step 3", verbose)
    assert "resumed from x" in caplog.text
    assert ("resumed from x" in capsys.readouterr().out) == bool(verbose)
