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
    r"block[- ]windows?|block[- ]order|whole-block|sampler's blocks?|\w+_blocks?\b|"
    r"\bblock_\w+",
    re.IGNORECASE,
)
"""Where *block* may stand in the remote layer's prose: the sampler's blocks (the block-window
order, its whole-block fetch), names (``check_block_bytes``, the on-disk key, and code in
backquotes)."""


def _docstrings(tree: ast.AST) -> list[ast.Constant]:
    """Every docstring (module, class, function, attribute) of ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            for k, stmt in enumerate(body):
                is_doc = k == 0 or isinstance(body[k - 1], (ast.Assign, ast.AnnAssign))
                if is_doc and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    if isinstance(stmt.value.value, str):
                        found.append(stmt.value)
    return found


def _prose(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every docstring (module, class, function, attribute) and comment."""
    source = path.read_text()
    found = [(doc.lineno, str(doc.value)) for doc in _docstrings(ast.parse(source))]
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


REMOTE_NAMES_NOT_PAGES = {
    "check_block_bytes": "the upload's option and the on-disk key it writes (mmpack.json)",
    "block_bytes": "StoreMeta.block_bytes: the format's stripe, on-disk key checksum.block_bytes",
    "crc32_blocks": "the store format's CRC-32 per stripe (mmpack._src.store.format)",
    "st_blocks": "os.stat_result field",
}
"""Names and words in the remote layer's code that say block for something other than a page,
each with the reason it keeps its name (reviewed; a page is a *page*)."""

REMOTE_NAMES_IN_ONE_FILE = {"_s3http.py": {"block"}}  # urllib3.PoolManager(block=False)

BLOCK_WORDS = {"block", "blocks", "nblocks"}


def _words(name: str) -> set[str]:
    """The lower-case words of an identifier (``snake_case`` and ``CamelCase``)."""
    return {w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", name)}


def _code_names(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of every identifier and every word of a string literal that is not a
    docstring (messages, keys, file names); docstrings and comments are prose (above)."""
    source = path.read_text()
    docs = {(d.lineno, d.col_offset) for d in _docstrings(ast.parse(source))}
    strings = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME:
            found.append((tok.start[0], tok.string))
        elif tok.type in strings and tok.start not in docs:
            found += [(tok.start[0], w) for w in re.findall(r"\w+", tok.string)]
    return found


def test_the_remote_layers_names_say_page_for_pages():
    """The remote layer's identifiers, messages, stats keys and file names call its checked,
    fetched and cached unit a *page* (``npages``, ``check_pages``, ``pages_dropped``,
    ``<cache_dir>/pages/``, "check page N"); *block* stays in the few reviewed names above."""
    stray = []
    for path in sorted(REMOTE.rglob("*.py")):
        allowed = set(REMOTE_NAMES_NOT_PAGES) | REMOTE_NAMES_IN_ONE_FILE.get(path.name, set())
        stray += [
            f"{path.name}:{line}: {name}"
            for line, name in _code_names(path)
            if name not in allowed and _words(name) & BLOCK_WORDS
        ]
    assert not stray, f"say page (docs/glossary.md), or list a reviewed name: {stray}"


def test_the_name_finder_sees_names_and_messages_not_docstrings(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        '"""A block."""\n\n\ndef f(nblocks, x):\n    """Block"""\n'
        '    return BlockingIOError, x.st_blocks, f"check block {x}", "blocks/", "Blocks"\n'
    )
    found = [(line, name) for line, name in _code_names(path) if _words(name) & BLOCK_WORDS]
    assert found == [(4, "nblocks"), (6, "st_blocks"), (6, "block"), (6, "blocks"), (6, "Blocks")]
