"""A small HTTP/1.1 client over trio sockets for the server tests: one request per connection."""

from __future__ import annotations

from urllib.parse import urlencode

import attrs
import trio


@attrs.frozen
class Reply:
    """A parsed response: status, headers (lower-case names; the last value wins), every
    Set-Cookie, and the body (chunked encoding undone)."""

    status: int
    headers: dict[str, str]
    cookies: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


def _unchunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


def parse(data: bytes, *, head_only: bool = False) -> Reply:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers: dict[str, str] = {}
    cookies: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        headers[name] = value
        if name == "set-cookie":
            key, _, rest = value.partition("=")
            cookies[key] = rest.split(";", 1)[0]
    if headers.get("transfer-encoding") == "chunked" and not head_only:
        body = _unchunk(body)
    return Reply(status, headers, cookies, body)


async def request(
    port: int,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    form: dict[str, str] | list[tuple[str, str]] | None = None,
    raw: bytes | None = None,
) -> Reply:
    """Send one request to 127.0.0.1:``port`` and read the whole reply."""
    all_headers = {"Host": f"127.0.0.1:{port}", "Connection": "close", **(headers or {})}
    body = b""
    if form is not None:
        body = urlencode(form).encode()
        all_headers["Content-Type"] = "application/x-www-form-urlencoded"
    if body or method == "POST":
        all_headers["Content-Length"] = str(len(body))
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in all_headers.items())]
    message = raw if raw is not None else ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(message)
            data = bytearray()
            while chunk := await stream.receive_some(65536):
                data += chunk
    return parse(bytes(data), head_only=method == "HEAD")
