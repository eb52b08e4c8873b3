"""The guides' Python code runs: each page's ```python blocks, in order, in one namespace.

A block is skipped only when the line just above its fence is an HTML comment
`<!-- not run: <reason> -->` (e.g. it needs a TPU); the reason is required.
A page with no block to run fails, so an emptied page cannot pass unnoticed.
Blocks run in-process with the current directory set to a temporary one, so
the `model_dir`s they name land there. A traceback points at the page's own
line numbers (the code is compiled with the Markdown file as its file name).
"""

import dataclasses
import pathlib
import re
import warnings

import keras
import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
GUIDES = ["quickstart.md", "loops.md", "tf_function.md", "mixed_precision.md", "services.md", "beyond_fit.md"]

_FENCE = re.compile(r"^(?P<fence>`{3,})(?:python|\{code-block\}\s+python)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->$")


@dataclasses.dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the first code line in the page
    code: str
    skip_reason: str | None


def python_blocks(text: str) -> list[Block]:
    """The page's ```python (and ```{code-block} python) blocks, in order."""
    lines = text.splitlines()
    blocks, index = [], 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        fence, start = match["fence"], index + 1
        end = start
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        if end == len(lines):
            raise ValueError(f"unclosed code fence opened at line {index + 1}")
        body = lines[start:end]
        # MyST directive options (`:caption: ...`) at the top of a code-block are not code.
        while "code-block" in lines[index] and body and body[0].startswith(":"):
            body, start = body[1:], start + 1
        previous = next((line.strip() for line in reversed(lines[:index]) if line.strip()), "")
        skipped = _NOT_RUN.match(previous)
        blocks.append(Block(start + 1, "\n".join(body) + "\n", skipped["reason"] if skipped else None))
        index = end + 1
    return blocks


def run_blocks(blocks: list[Block], filename: str) -> dict:
    """Runs the blocks not marked `not run`, in order, in one namespace; errors propagate."""
    runnable = [block for block in blocks if block.skip_reason is None]
    assert runnable, f"{filename} has no ```python block to run"
    namespace = {"__name__": "__docs__"}
    for block in runnable:
        # Padding keeps the page's line numbers in tracebacks.
        source = "\n" * (block.line - 1) + block.code
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102
    return namespace


@pytest.fixture
def clean_keras(tmp_path, monkeypatch):
    """A fresh working directory, the float32 policy and a clean Keras session around each page."""
    monkeypatch.chdir(tmp_path)
    policy = keras.config.dtype_policy()
    keras.backend.clear_session()
    yield
    keras.config.set_dtype_policy(policy)
    keras.backend.clear_session()


@pytest.mark.parametrize("page", GUIDES)
def test_guide_code_runs(page, clean_keras, capsys):
    path = DOCS / page
    blocks = python_blocks(path.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        run_blocks(blocks, str(path))
    skipped = [f"line {block.line}: {block.skip_reason}" for block in blocks if block.skip_reason]
    with capsys.disabled():
        if skipped:
            print(f"\n{page}: not run: " + "; ".join(skipped))


@pytest.mark.parametrize("page", ["install.md", *GUIDES])
def test_guide_has_one_title_and_no_skipped_heading_levels(page):
    levels = []
    in_fence = None
    for line in (DOCS / page).read_text().splitlines():
        fence = re.match(r"^(`{3,})", line)
        if fence and (in_fence is None or line.strip() == in_fence):
            in_fence = None if in_fence else fence[1]
            continue
        heading = re.match(r"^(#{1,6}) ", line)
        if in_fence is None and heading:
            levels.append(len(heading[1]))
    assert levels and levels[0] == 1 and levels.count(1) == 1, levels
    for before, after in zip(levels, levels[1:], strict=False):
        assert after <= before + 1, f"{page}: heading level jumps from {before} to {after}"


# ------------------------------------------------------------ the runner itself


def test_blocks_are_found_in_order_with_their_line_numbers_and_skip_reasons():
    page = (
        "# T\n\n```python\na = 1\n```\n\n<!-- not run: needs a TPU -->\n```python\ntpu()\n```\n\n"
        "```text\nnot code\n```\n\n````{code-block} python\nb = a + 1\n````\n"
    )
    blocks = python_blocks(page)
    assert [(b.line, b.code, b.skip_reason) for b in blocks] == [
        (4, "a = 1\n", None),
        (9, "tpu()\n", "needs a TPU"),
        (17, "b = a + 1\n", None),
    ]
    assert run_blocks(blocks, "page.md")["b"] == 2


def test_a_failing_block_fails_with_the_page_line():
    blocks = python_blocks("# T\n\n```python\nx = 1\nraise RuntimeError('broken guide')\n```\n")
    with pytest.raises(RuntimeError, match="broken guide") as info:
        run_blocks(blocks, "page.md")
    last = info.tb
    while last.tb_next is not None:
        last = last.tb_next
    assert (last.tb_frame.f_code.co_filename, last.tb_lineno) == ("page.md", 5)


def test_a_page_without_code_to_run_fails():
    with pytest.raises(AssertionError, match="no ```python block"):
        run_blocks(python_blocks("# T\n\nJust words.\n\n```bash\nls\n```\n"), "page.md")
    only_skipped = "# T\n\n<!-- not run: needs a TPU -->\n```python\ntpu()\n```\n"
    with pytest.raises(AssertionError, match="no ```python block"):
        run_blocks(python_blocks(only_skipped), "page.md")
