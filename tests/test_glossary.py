"""One word per unit (docs/glossary.md): a name a module exports that says *block* names the
sampler's block (or is listed as no unit at all); the format's checksum unit is a *stripe* and
the remote store's checked unit a *page*.  A new name that says block for another unit fails."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mmpack" / "_src"
GLOSSARY = PACKAGE.parents[1] / "docs" / "glossary.md"

SAMPLER_BLOCK = {
    "core/constants.py": {"FETCH_BLOCK_BYTES", "WINDOW_BLOCKS"},
    "core/sample_order.py": {"order_block_bytes"},
    "core/validation.py": {"check_block_bounds"},
    "sampling/block_order.py": {"BlockOrder"},
    "sampling/mixture_blocks.py": {"BlockPasses"},
    "packing/region_cuts.py": {"region_blocks"},
}
"""Names of the sampler's block (``block_bounds``, ``shuffle="blocks"``)."""

NOT_A_UNIT = {
    "torch/attention.py": {"batched_block_causal_mask", "block_causal_mask"},  # block-diagonal
}


def _public_names() -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names[str(path.relative_to(PACKAGE))] = set(ast.literal_eval(node.value))
    return names


def test_block_names_the_samplers_block_only():
    allowed = {
        rel: SAMPLER_BLOCK.get(rel, set()) | NOT_A_UNIT.get(rel, set())
        for rel in {*SAMPLER_BLOCK, *NOT_A_UNIT}
    }
    public = _public_names()
    assert public, f"no module with __all__ under {PACKAGE}"
    stray = {
        rel: sorted(n for n in names if "block" in n.lower() and n not in allowed.get(rel, set()))
        for rel, names in public.items()
    }
    stray = {rel: found for rel, found in stray.items() if found}
    assert not stray, (
        f"public names that say block: name the unit by its glossary word (docs/glossary.md), "
        f"or list a name of the sampler's block in SAMPLER_BLOCK: {stray}"
    )


def test_the_lists_name_what_exists_and_words_the_glossary_defines():
    public = _public_names()
    glossary = GLOSSARY.read_text()
    for table in (SAMPLER_BLOCK, NOT_A_UNIT):
        for rel, names in table.items():
            assert names <= public.get(rel, set()), f"{rel}: {names - public.get(rel, set())} gone"
    for word in ("block", "stripe", "page"):  # the three units the name once shared
        assert f"**{word}**" in glossary, f"docs/glossary.md defines no {word!r}"


REMOTE = PACKAGE / "remote"
SAMPLER_PHRASES = re.compile(
    r"block[- ]windows?|block[- ]order|whole-block|sampler's blocks?|blocks/|\w+_blocks?\b|"
    r"\bblock_\w+",
    re.IGNORECASE,
)
"""Where *block* may stand in the remote layer's prose: the sampler's blocks (the block-window
order, its whole-block fetch), the node cache's folder ``blocks/``, names (``check_block_bytes``,
the on-disk key, and code in backquotes)."""


def _prose(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every docstring (module, class, function, attribute) and comment."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            for k, stmt in enumerate(body):
                is_doc = k == 0 or isinstance(body[k - 1], (ast.Assign, ast.AnnAssign))
                if is_doc and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    if isinstance(stmt.value.value, str):
                        found.append((stmt.lineno, stmt.value.value))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found.append((tok.start[0], tok.string))
    return found


def test_the_remote_layers_prose_says_page_for_pages():
    """The remote layer's docstrings and comments call its checked, fetched and cached unit a
    *page* (names were renamed, the prose had kept *block*); *block* stays for the sampler's
    blocks only."""
    stray = []
    for path in sorted(REMOTE.rglob("*.py")):
        for line, text in _prose(path):
            text = SAMPLER_PHRASES.sub("", re.sub(r"``.*?``|`[^`]*`", "", text, flags=re.DOTALL))
            stray += [
                f"{path.name}:{line}: {m.group()}" for m in re.finditer(r"\bblocks?\b", text, re.I)
            ]
    assert not stray, f"say page (docs/glossary.md): {stray}"


def test_the_prose_finder_sees_docstrings_and_comments(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        '"""A block."""\nX = 1\n"""blocks"""\n\n\ndef f():\n    """Block"""\n    # a block\n'
    )
    assert [line for line, _ in _prose(path)] == [1, 3, 7, 8]
