"""Write the blocking drivers from the asyncio ones: each behaviour has one source.

    python tools/async_to_sync.py           # regenerate every sync/ module
    python tools/async_to_sync.py --check   # fail if one is stale or hand-edited

Every module in `journal/aio/` and `projections/aio/` (except the hand-written
`flavour.py`) is the source of its twin in the sibling `sync/` package. The
transformation is mechanical and small, so a reader can predict it:

* `async` before `def`/`with`/`for` and every `await` are dropped;
* `Awaitable[X]` and `Coroutine[A, B, X]` become `X`, `AsyncGenerator[X, Y]`
  becomes `Generator[X, Y, None]`;
* the names in `NAMES` are renamed where they stand as names (the async
  protocols and psycopg classes to their blocking twins, `aio` to `sync` in
  module paths, the public classes to their `Sync...` names), and the
  CamelCase ones in docstrings and comments too;
* `if ASYNC: ... else: ...` keeps only the `else` branch (dedented), for the
  rare lines whose flavours differ beyond a rename;
* the result is formatted with `ruff` (and unused imports removed), and gets
  a header saying where it came from.

Wait, spawn and queue primitives that differ in kind, not in name, live in
`journal/{aio,sync}/flavour.py`, written by hand once per flavour.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("journal", "projections")
HAND_WRITTEN = {"flavour.py"}

NAMES = {
    # the language and the standard library
    "AsyncIterator": "Iterator",
    "AsyncIterable": "Iterable",
    "AsyncGenerator": "Generator",
    "AbstractAsyncContextManager": "AbstractContextManager",
    "AsyncExitStack": "ExitStack",
    "asynccontextmanager": "contextmanager",
    "aclosing": "closing",
    "aclose": "close",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    # psycopg
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncCursor": "Cursor",
    "AsyncRawCursor": "RawCursor",
    "AsyncServerCursor": "ServerCursor",
    "AsyncPipeline": "Pipeline",
    # our packages and public classes
    "aio": "sync",
    "Journal": "SyncJournal",
    "JournalPool": "SyncJournalPool",
    "DurableStateStore": "SyncDurableStateStore",
    "AggregateRepository": "SyncAggregateRepository",
    "Projection": "SyncProjection",
    "ProjectionGroup": "SyncProjectionGroup",
    "ProjectionManagement": "SyncProjectionManagement",
    "FleetControl": "SyncFleetControl",
    "Retention": "SyncRetention",
    "Handler": "SyncHandler",
    "GroupedHandler": "SyncGroupedHandler",
    "AtLeastOnceHandler": "SyncAtLeastOnceHandler",
    "ChangeHandler": "SyncChangeHandler",
    "GroupedChangeHandler": "SyncGroupedChangeHandler",
    "AtLeastOnceChangeHandler": "SyncAtLeastOnceChangeHandler",
    "Decide": "SyncDecide",
}
UNWRAP = {"Awaitable": 0, "Coroutine": 2}  # keep the type argument at this index
_DOC_NAMES = {k: v for k, v in NAMES.items() if k[:1].isupper() or k.startswith("__")}
_DOC_PATTERN = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, _DOC_NAMES)) + r")(?!\w)")


def header(source: Path) -> str:
    rel = source.relative_to(ROOT).as_posix()
    return (
        f"# Generated from {rel} by tools/async_to_sync.py: do not edit.\n"
        "# Change the source, then `./dev generate`; `./dev lint` fails while this is stale.\n"
    )


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block(lines: list[str], start: int, indent: int) -> int:
    """The index after the block of lines more indented than `indent` from `start`."""
    i = start
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
        i += 1
    while i > start and not lines[i - 1].strip():  # trailing blank lines belong outside
        i -= 1
    return i


def keep_sync_branches(text: str) -> str:
    """Replace each `if ASYNC: A else: B` by B dedented (nothing if there is no else)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == "if ASYNC:":
            indent = _indent(line)
            end = _block(lines, i + 1, indent)
            if end < len(lines) and lines[end].strip() == "else:" and _indent(lines[end]) == indent:
                else_end = _block(lines, end + 1, indent)
                body = lines[end + 1 : else_end]
                step = min(_indent(b) for b in body if b.strip()) - indent
                out.extend(b[step:] if b.strip() else b for b in body)
                i = else_end
            else:
                i = end
            continue
        out.append(line)
        i += 1
    return "".join(out)


# Phrases of docstrings and comments that name the flavour.
DOC_PHRASES = {
    "asyncio here": "blocking here",
    "asyncio drivers": "blocking drivers",
    "async driver": "sync driver",
    "async executor": "sync executor",
    "async aggregate": "sync aggregate",
}
_PHRASE_PATTERN = re.compile("|".join(map(re.escape, DOC_PHRASES)))


def _rename_docs(text: str) -> str:
    text = _PHRASE_PATTERN.sub(lambda m: DOC_PHRASES[m.group(0)], text)
    return _DOC_PATTERN.sub(lambda m: _DOC_NAMES[m.group(1)], text)


def transform_tokens(text: str) -> str:
    """Drop async/await, unwrap Awaitable/Coroutine, rename names (see the module doc)."""
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def pos(row: int, col: int) -> int:
        return offsets[row - 1] + col

    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), non-overlapping
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        start, end = pos(*tok.start), pos(*tok.end)
        if tok.type == tokenize.NAME and tok.string in ("async", "await"):
            edits.append((start, pos(*tokens[i + 1].start), ""))
        elif tok.type == tokenize.NAME and tok.string in UNWRAP and tokens[i + 1].string == "[":
            # Keep only the wanted argument of `Awaitable[...]` / `Coroutine[..., ..., X]`.
            depth, j, commas, arg_start = 0, i + 1, 0, i + 2
            keep_from = keep_to = None
            while True:
                t = tokens[j]
                if t.string in "([{" and t.type == tokenize.OP:
                    depth += 1
                elif t.string in ")]}" and t.type == tokenize.OP:
                    depth -= 1
                    if depth == 0:
                        if commas == UNWRAP[tok.string]:
                            keep_from, keep_to = arg_start, j
                        break
                elif t.string == "," and depth == 1:
                    if commas == UNWRAP[tok.string]:
                        keep_from, keep_to = arg_start, j
                    commas += 1
                    arg_start = j + 1
                j += 1
            assert keep_from is not None and keep_to is not None
            inner = text[pos(*tokens[keep_from].start) : pos(*tokens[keep_to - 1].end)]
            edits.append((start, pos(*tokens[j].end), transform_tokens(inner).strip()))
            i = j + 1
            continue
        elif tok.string == "AsyncGenerator" and tokens[i + 1].string == "[":
            # typing's Generator takes three arguments: the return type is None.
            depth, j = 0, i + 1
            while True:
                if tokens[j].type == tokenize.OP and tokens[j].string in "([{":
                    depth += 1
                elif tokens[j].type == tokenize.OP and tokens[j].string in ")]}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            edits.append((start, end, "Generator"))
            close = pos(*tokens[j].start)
            edits.append((close, close, ", None"))
        elif tok.type == tokenize.NAME and tok.string in NAMES:
            edits.append((start, end, NAMES[tok.string]))
        elif tok.type in (tokenize.STRING, tokenize.COMMENT):
            renamed = _rename_docs(tok.string)
            if renamed != tok.string:
                edits.append((start, end, renamed))
        i += 1
    out = []
    last = 0
    for start, end, replacement in edits:
        out.append(text[last:start])
        out.append(replacement)
        last = end
    out.append(text[last:])
    return "".join(out)


def _ruff(args: list[str], text: str, filename: Path) -> str:
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run(
        [str(ruff), *args, "--stdin-filename", str(filename), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if result.returncode != 0:
        raise SystemExit(f"ruff failed on the generated {filename}:\n{result.stderr}")
    return result.stdout


def generate(source: Path) -> str:
    """The sync module generated from one async source module."""
    text = source.read_text(encoding="utf-8")
    text = transform_tokens(keep_sync_branches(text))
    target = target_of(source)
    # The project's own rules, so that the generated module is as lint-clean as its source.
    text = _ruff(["check", "--fix", "--exit-zero", "--quiet"], text, target)
    text = _ruff(["format", "--quiet"], text, target)
    return header(source) + text


def target_of(source: Path) -> Path:
    return source.parent.parent / "sync" / source.name


def sources() -> list[Path]:
    found: list[Path] = []
    for package in PACKAGES:
        folder = ROOT / package / "aio"
        found.extend(p for p in sorted(folder.glob("*.py")) if p.name not in HAND_WRITTEN)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a sync module is stale")
    args = parser.parse_args(argv)
    stale = []
    for source in sources():
        target = target_of(source)
        text = generate(source)
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(target.relative_to(ROOT).as_posix())
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)}")
    expected = {target_of(s).name for s in sources()} | HAND_WRITTEN
    for package in PACKAGES:
        folder = ROOT / package / "sync"
        for orphan in sorted(folder.glob("*.py")):
            if orphan.name not in expected:
                stale.append(f"{orphan.relative_to(ROOT).as_posix()} (no source in aio/)")
    if stale:
        print(
            "generated sync modules are stale or hand-edited (run ./dev generate):\n  "
            + "\n  ".join(stale),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
