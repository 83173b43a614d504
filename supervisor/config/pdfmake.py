"""A small PDF of plain text (Helvetica, 50 lines a page), as the research example makes its papers (pure)."""

from __future__ import annotations

LINES_PER_PAGE = 50


def _escape(line: str) -> str:
    text = line.encode("latin-1", "replace").decode("latin-1")
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def pdf(text: str, title: str = "") -> bytes:
    """The bytes of a PDF showing `text`, its lines as they are (long ones are not wrapped)."""
    lines = text.splitlines() or [""]
    pages = [lines[i:i + LINES_PER_PAGE] for i in range(0, len(lines), LINES_PER_PAGE)]
    objects: list[bytes] = []
    kids = " ".join(f"{4 + 2 * n} 0 R" for n in range(len(pages)))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    for n, page in enumerate(pages):
        body = "BT /F1 10 Tf 14 TL 50 790 Td " + " ".join(f"({_escape(line)}) '" for line in page) + " ET"
        stream = body.encode("latin-1")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Resources << /Font << /F1 3 0 R >> >>"
                       f" /Contents {5 + 2 * n} 0 R >>".encode())
        objects.append(b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    info = f"<< /Title ({_escape(title)}) >>".encode() if title else b"<< >>"
    offsets.append(len(out))
    out += f"{len(objects) + 1} 0 obj\n".encode() + info + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(offsets) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += (f"trailer\n<< /Size {len(offsets) + 1} /Root 1 0 R /Info {len(objects) + 1} 0 R >>\n"
            f"startxref\n{xref}\n%%EOF\n").encode()
    return bytes(out)
