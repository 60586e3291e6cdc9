"""Deploy zips for tests: built entry by entry (modes, links, duplicate names on purpose),
and an HTTP handler that serves them from its server's `files` (path -> bytes)."""
import io
import stat
import warnings
import zipfile
from http.server import BaseHTTPRequestHandler


def file_entry(name, data, mode=0o644, deflate=False):
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFREG | mode) << 16
    if deflate:
        info.compress_type = zipfile.ZIP_DEFLATED
    return info, data


def dir_entry(name):
    info = zipfile.ZipInfo(name.rstrip("/") + "/")
    info.external_attr = ((stat.S_IFDIR | 0o755) << 16) | 0x10
    return info, b""


def link_entry(name, target):
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info, target.encode()


def make_zip(*entries) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are built on purpose
        with zipfile.ZipFile(buf, "w") as zf:
            for info, data in entries:
                zf.writestr(info, data)
    return buf.getvalue()


class ZipHandler(BaseHTTPRequestHandler):
    # HTTP/1.0: a body without Content-Length ends when the connection closes.
    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/endless":
            self.send_response(200)
            self.send_header("Content-Type", "application/zip")
            self.end_headers()
            try:
                while True:  # until the client hangs up
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                return
        body = self.server.files.get(path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/zip")
        if not path.startswith("/nolength/"):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *args):
        pass
