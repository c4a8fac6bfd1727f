"""The `startup-script` metadata value: the bootstrap with the agent zipapp embedded.

The agent's modules go into one zip with `__main__.py` at its root, as
`python -m zipapp` lays one out (docs.python.org/3/library/zipapp.html: the
interpreter runs a zip whose root holds `__main__.py`). The bytes are
deterministic, so a node's metadata changes only when the agent's code does:
names in sorted order, every entry dated 1980-01-01 (the zip format's earliest
date) with fixed permissions, and stored, not deflated (zlib's output may differ
between zlib builds; Python's zipfile defaults to ZIP_STORED). The zip travels
base64-encoded in the bash bootstrap (a metadata value is text), so each module goes in
without its comments and docstrings (`lean`): a quarter of the bytes, every line where
it was (a traceback on the node names the same
line numbers as the source here). For the same budget a module's longer description is
written as comments under its one-line docstring.
"""

from __future__ import annotations

import ast
import base64
import io
import tokenize
import zipfile
from pathlib import Path

from node_agent.contract import MAX_METADATA_VALUE_BYTES

HERE = Path(__file__).resolve().parent
ZIPAPP_MARKER = "@AGENT_ZIPAPP_BASE64@"
FIXED_DATE = (1980, 1, 1, 0, 0, 0)
# The entry point falls back to the previous agent (agent.previous.pyz beside this one,
# node_agent/handover.py) when this one's modules do not import: its version is recorded
# as refused and the previous one's bytes go back on this file, so a restart does not
# loop on the same broken file and a job handed over keeps running.
ENTRY_POINT = b"""import sys

try:
    from node_agent.agent import main
except Exception:
    import hashlib, os, pathlib, traceback
    traceback.print_exc()
    here = pathlib.Path(sys.argv[0])
    previous = here.with_name("agent.previous.pyz")
    if sys.argv[1:2] != ["run"] or not previous.is_file() or \\
            previous.read_bytes() == here.read_bytes():
        raise
    run = pathlib.Path(os.environ.get("TPU_STACK_ROOT") or "/opt/tpu-stack") / "run"
    run.mkdir(parents=True, exist_ok=True)
    with (run / "agent-refused").open("a") as refused:
        refused.write(hashlib.sha256(here.read_bytes()).hexdigest()[:12] + "\\n")
    partial = here.with_name("." + here.name + ".partial")
    partial.write_bytes(previous.read_bytes())
    os.replace(partial, here)
    print("tpu-stack-agent: this agent does not import; falling back to the previous one",
          file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, str(here), *sys.argv[1:]])

sys.exit(main())
"""
# base64(1) -d reads lines of any length (it skips newlines, coreutils' base64 docs), and
# handover.zipapp_in_script joins them: long lines save a byte every 76 of a metadata
# value that is short of room (the wrap was base64's default, 76).
BASE64_LINE = 4096


def modules() -> list[Path]:
    """The agent's modules: every one but this build step (infra side only)."""
    return sorted(path for path in HERE.glob("*.py") if path.name != "build.py")


def zipapp() -> bytes:
    """The agent as one zipapp: the same bytes on every machine for the same sources."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        entries = [("__main__.py", ENTRY_POINT)]
        entries += [(f"node_agent/{path.name}", lean(path.read_text()).encode())
                    for path in modules()]
        for name, data in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=FIXED_DATE)
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return out.getvalue()


def lean(source: str) -> str:
    """`source` without comments and docstrings, each line kept in place: a comment is
    cut from its line; a docstring's lines go blank (`""` where it is its body's only
    statement). A module that reads `__doc__` keeps its own (the agent prints its usage
    from it)."""
    lines = source.splitlines(keepends=True)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            line = lines[row - 1]
            lines[row - 1] = line[:col].rstrip() + ("\n" if line.endswith("\n") else "")
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module) and "__doc__" in source:
            continue
        if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                                 ast.ClassDef)) or not node.body:
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)) or first.end_lineno is None:
            continue
        start, end = first.lineno, first.end_lineno
        if lines[start - 1][:first.col_offset].strip() or \
                lines[end - 1][first.end_col_offset:].strip():
            continue  # shares a line with other code: left as it is
        indent = lines[start - 1][:first.col_offset]
        for row in range(start - 1, end):
            lines[row] = "\n"
        if len(node.body) == 1:  # the body's only statement: a body must stay
            lines[start - 1] = f'{indent}""\n'
    return "".join(lines)


def bare_script(bootstrap: str) -> str:
    """The bootstrap without its comment lines (the shebang kept) and its indentation: a
    metadata value is short of room, and the comments are read here, in
    node_agent/bootstrap.sh. Inside the unit's here-document they are systemd comment
    lines, also only for people, and no line is indented (bash and systemd ignore a
    line's leading blanks; a here-document's are kept, so it must have none)."""
    lines = bootstrap.splitlines(keepends=True)
    return lines[0] + "".join(line.lstrip(" ") for line in lines[1:]
                              if not line.lstrip().startswith("#"))


def startup_script(agent: bytes | None = None) -> str:
    """The bootstrap with the zipapp (`agent`, else this checkout's) embedded; refuses
    to outgrow a metadata value."""
    encoded = base64.b64encode(zipapp() if agent is None else agent).decode()
    lines = "\n".join(encoded[i:i + BASE64_LINE] for i in range(0, len(encoded), BASE64_LINE))
    script = bare_script((HERE / "bootstrap.sh").read_text()).replace(ZIPAPP_MARKER, lines, 1)
    size = len(script.encode())
    if size > MAX_METADATA_VALUE_BYTES:
        raise ValueError(f"startup-script is {size} bytes; GCP allows "
                         f"{MAX_METADATA_VALUE_BYTES} per metadata value")
    return script
