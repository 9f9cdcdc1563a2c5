"""The documentation site builds with ``mkdocs build --strict`` and renders in a real browser.

The site is built into a temporary folder, served on 127.0.0.1 by a thread that records the
status of every request, and opened in headless Chromium (Debian's ``chromium``). The test
reads the DOM Chromium renders (``--dump-dom``) and keeps a screenshot of each page in its
tmp dir. Skipped when Chromium or MkDocs (``pip install -e ".[docs]"``) is missing.
"""

from __future__ import annotations

import ast
import functools
import html
import http.server
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.slow,  # about 30 s on 2 cores: the build, then one browser start per page
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)"),
]


def _docstring_first_line(module: str, function: str) -> str:
    """The first line of a function's docstring, read from the source (not from the site);
    ``module`` is dotted below ``jaxbsd`` (``"compression.api"``)."""
    tree = ast.parse((ROOT / "jaxbsd" / f"{module.replace('.', '/')}.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    return ast.get_docstring(node).splitlines()[0].replace("``", "")


def _text(dom: str) -> str:
    """Visible text of a DOM dump: tags dropped, entities decoded, whitespace collapsed."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


class _Server:
    """A static file server for the built site on 127.0.0.1 that records every request."""

    def __init__(self, directory: pathlib.Path):
        self.requests: list[tuple[str, int]] = []
        requests = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_request(self, code="-", size="-"):
                requests.append((self.path, int(code)))

            def log_message(self, *args):  # keep the test output quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("docs")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                            "-f", str(ROOT / "mkdocs.yml"), "-d", str(out / "site")],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    server = _Server(out / "site")
    yield out, server
    server.close()


def _open(site, page: str, name: str) -> str:
    """Open ``page`` in headless Chromium: the rendered DOM, and a screenshot kept as ``name``.png."""
    out, server = site
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--window-size=1280,1600"]
    url = f"{server.url}/{page}"
    before = len(server.requests)
    dom = subprocess.run([*flags, f"--user-data-dir={out / (name + '-dom')}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    shot = out / f"{name}.png"
    subprocess.run([*flags, f"--user-data-dir={out / (name + '-shot')}", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"no screenshot of {page}"
    from PIL import Image

    with Image.open(shot) as image:  # a blank page is one colour
        low, high = image.convert("L").getextrema()
    assert high - low > 64, f"blank screenshot of {page}"
    served = server.requests[before:]
    assert any(path.split("?")[0] == "/" + page for path, _ in served), f"{page} was never requested"
    missing = [(path, code) for path, code in served if code != 200]
    assert not missing, f"{page}: requests that did not return 200: {missing}"
    return dom


def test_index_renders(site):
    text = _text(_open(site, "", "index"))
    for heading in ("jaxbsd", "Set-up on a fresh machine", "Where the data sets live", "Where to go next"):
        assert heading in text
    assert "pip install -e . && jaxbsd compress" in text


def test_compress_model_reference_renders_its_docstring(site):
    dom = _open(site, "api/compress_model/", "compress_model")
    assert 'id="jaxbsd.compression.api.compress_model"' in dom
    assert _docstring_first_line("compression.api", "compress_model") in _text(dom)


@pytest.mark.parametrize("page, module, function", [("api/", "solver.driver", "decouple"), ("api/solver/", "solver.cmtf", "solve"),
                                                    ("api/compress_model/", "compression.api", "compress_model")])
def test_api_reference_shows_the_main_functions(site, page, module, function):
    out, _ = site
    dom = (out / "site" / page / "index.html").read_text()
    assert f'id="jaxbsd.{function}"' in dom or f'id="jaxbsd.{module}.{function}"' in dom
    assert _docstring_first_line(module, function) in _text(dom)


def test_every_public_name_is_in_the_api_reference(site):
    out, _ = site
    ids = set()
    for page in (out / "site" / "api").rglob("index.html"):
        ids |= set(re.findall(r'id="(jaxbsd[\w.]*)"', page.read_text()))
    init = ast.parse((ROOT / "jaxbsd" / "__init__.py").read_text())
    names = next(ast.literal_eval(n.value) for n in init.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__")
    assert names and not [n for n in names if f"jaxbsd.{n}" not in ids]


#: The pages that show committed results: every plot of experiments/results/ is on one of them.
RESULT_PAGES = ("results/", "real-models/")


def test_results_pages_show_every_plot(site):
    shown = set()
    for page in RESULT_PAGES:
        dom = _open(site, page, page.strip("/"))
        shown |= {pathlib.PurePosixPath(src).name for src in re.findall(r'<img[^>]+src="([^"]+\.png)"', dom)}
    plots = {p.name for p in (ROOT / "experiments" / "results").glob("*.png")}
    assert plots and plots <= shown, f"plots on none of the results pages {RESULT_PAGES}: {sorted(plots - shown)}"
    _, server = site
    served = {pathlib.PurePosixPath(path).name for path, code in server.requests if code == 200}
    assert plots <= served, f"plots not served: {sorted(plots - served)}"


def test_every_public_module_is_in_the_api_reference(site):
    """A new module of the package needs its ``::: jaxbsd.<module>`` line on a page of docs/api/."""
    out, _ = site
    ids = set()
    for page in (out / "site" / "api").rglob("index.html"):
        ids |= set(re.findall(r'id="(jaxbsd[\w.]*)"', page.read_text()))
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
               for p in (ROOT / "jaxbsd").rglob("*.py") if not p.name.startswith("_") or p.name == "__init__.py"}
    assert modules and not sorted(modules - ids)
