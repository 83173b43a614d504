"""Extract the text of a PDF (pypdf) or a text file, optionally into a file: reading papers, offline."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from hermes_sup.agents.files import read_bytes, write_text
from hermes_sup.agents.offer import FILE_CUE
from hermes_sup.agents.tools import Tool, ToolError, register

MAX_CHARS = 200_000
TIMEOUT = 30.0
# pypdf parses whatever the file holds: a hostile PDF (deep nesting, a page tree that loops, a stream
# that inflates without end) is parsed in a process of its own, bounded in time and memory.
PARSE = """
import io, json, resource, sys
for limit, value in ((resource.RLIMIT_CPU, 30), (resource.RLIMIT_AS, 1 << 30)):
    resource.setrlimit(limit, (value, value))
try:
    from pypdf import PdfReader
except ImportError:
    print(json.dumps({"error": "pypdf is not installed here (pip install pypdf)"})); sys.exit()
try:
    reader = PdfReader(io.BytesIO(sys.stdin.buffer.read()))
    pages = [(page.extract_text() or "") for page in reader.pages[:int(sys.argv[1])]]
    print(json.dumps({"pages": pages, "count": len(reader.pages)}))
except Exception as exc:
    print(json.dumps({"error": f"not a readable PDF: {type(exc).__name__}: {exc}"[:300]}))
"""


def pdf_pages(data: bytes, most: int = 500) -> tuple[list[str], int]:
    """The text of a PDF's first `most` pages and its page count; ToolError for what is no PDF."""
    try:
        done = subprocess.run([sys.executable, "-P", "-c", PARSE, str(most)], input=data, capture_output=True,
                              timeout=TIMEOUT, close_fds=True)
    except subprocess.TimeoutExpired:
        raise ToolError(f"the PDF took more than {TIMEOUT:g} s to read; it was given up") from None
    try:
        answer = json.loads(done.stdout or b"{}")
    except ValueError:
        answer = {}
    if "pages" not in answer:
        raise ToolError(answer.get("error") or f"the PDF could not be read (exit {done.returncode})")
    return answer["pages"], answer["count"]


def extract_text(ctx: Any, args: dict[str, Any]) -> str:
    data = read_bytes(ctx, args["path"])
    if data[:5] == b"%PDF-":
        pages, count = pdf_pages(data)
        text = "\n\n".join(f"[page {n}]\n{page.strip()}" for n, page in enumerate(pages, 1))
        what = f"{count} page(s)"
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{args['path']} is neither a PDF nor UTF-8 text") from None
        what = "text"
    text = text[:MAX_CHARS]
    if args.get("out"):
        write_text(ctx, args["out"], text)
        return f"{args['path']} ({what}): {len(text):,} characters written to {args['out']}\n{text[:500]}"
    return text


register(Tool("extract_text", "The text of a PDF or a text file (into `out`, a file, when given).", extract_text,
              {"type": "object", "properties": {
                  "path": {"type": "string", "minLength": 1},
                  "out": {"type": "string", "description": "a file to write the text to"}},
                  "required": ["path"], "additionalProperties": False},
              capabilities=("fs.read", "fs.write"), idempotent=True,
              cues=(FILE_CUE, "pdf", "paper", "extract", "read")))
