"""The Python binding installed as users install it, imported from clean virtualenvs
(python3 -m venv, no system site-packages, nothing from the network), with neither
MAPFLOW_LIB nor LD_LIBRARY_PATH set and the working directory outside the checkout:

1. `make install-client PREFIX=<tmp>`, then a wheel built from (a copy of) client/python
   with the PREFIX's lib/pkgconfig on PKG_CONFIG_PATH and no build tree to fall back on,
   pip-installed into a venv: it loads <tmp>/lib/libmapflow.so.0.
2. The package files `make install` wrote (<tmp>/lib/python3/dist-packages) on the venv's
   PYTHONPATH: the same library, through the _config.py make install wrote.
3. A wheel built with MAPFLOW_BUNDLE=1: the library inside the package is the one loaded.
Each time the venv's interpreter talks to a real daemon: health, a put of a random row
from mapflow-synth, a get that returns its bytes, NotFound for a missing key, and
__version__ equal to the header's version. The wheel is built by Debian's pip (which has
python3-wheel); a venv's own pip would need `wheel` from the network to build one.
Env: MF_BIN, MF_BUILD, PYTHON (the interpreter that makes the venvs).
"""
import glob
import os
import random
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mftest  # noqa: E402

mftest.preload_asan()
mapflow = mftest.import_mapflow()

PY = sys.executable
NS, MODEL, B = "py-inst", "py-inst-src", 16

CHECK = r"""
import os, sys
import mapflow
want_lib, sock, row_path, model, layer, hsh, version, pip = sys.argv[1:]
assert os.path.realpath(mapflow._lib_path) == os.path.realpath(want_lib), mapflow._lib_path
assert mapflow.__version__ == version, (mapflow.__version__, version)
if pip == "1":  # the package's metadata says the same version
    from importlib.metadata import version as dist_version
    assert dist_version("mapflow") == version, dist_version("mapflow")
row = open(row_path, "rb").read()
with mapflow.Channel("unix:" + sock, ns="py-inst") as ch:
    assert ch.health()["ok"]
    ch.put(row)
    assert ch.get(model, int(layer), hsh) == row
    try:
        ch.get(model, int(layer) + 1, hsh)
        raise AssertionError("a missing key was found")
    except mapflow.NotFound as e:
        assert not e.message.startswith("NOT_FOUND"), e.message
print("ok", mapflow._lib_path)
"""


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise AssertionError("%s exited %d:\n%s%s" % (" ".join(cmd), p.returncode,
                                                     p.stdout[-3000:], p.stderr[-3000:]))
    return p.stdout


class InstallTest(mftest.DaemonTest):
    @classmethod
    def setUpClass(cls):
        cls.make_tmp("mfpyi-")
        rng = random.Random()
        tokens = [rng.randrange(1, 60000) for _ in range(B * 2)]
        layer = rng.randrange(0, 40)
        rows = mftest.synth_rows(cls.tmp, NS, MODEL, B, tokens, (layer,), 1,
                                 rng.randrange(1000))
        cls.row_path = os.path.join(cls.tmp, "row.bin")
        with open(cls.row_path, "wb") as f:
            f.write(rows[layer][0])
        cls.layer = layer
        cls.hash = mapflow.hash_prefix(NS, MODEL, B, tokens)[0]
        with open(os.path.join(mftest.ROOT, "client", "mapflow.h")) as f:
            cls.version = re.search(r'#define MF_VERSION_STRING "([^"]+)"', f.read()).group(1)
        cls.start_daemon(mapflow, "--host_bytes", "16mb")
        # Only the install, nothing of an outer make's state; the library is built already.
        build = os.path.relpath(mftest.BUILD, mftest.ROOT)
        cls.prefix = os.path.join(cls.tmp, "prefix")
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS",
                                                                "MAKELEVEL")}
        run(["make", "--no-print-directory", "-C", mftest.ROOT, "BUILD=" + build,
             "-o", "%s/lib/libmapflow.so.%s" % (build, cls.version),
             "-o", "%s/lib/libmapflow.a" % build, "-o", "%s/bin/mapflowctl" % build,
             "DESTDIR=", "PREFIX=" + cls.prefix, "install-client"], env=env)

    def clean_env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAPFLOW_LIB", "LD_LIBRARY_PATH", "PYTHONPATH", "PKG_CONFIG_PATH",
                            "MF_BUILD", "PIP_FIND_LINKS", "VIRTUAL_ENV")}
        env["PIP_NO_CACHE_DIR"] = "1"
        env.update(extra)
        return env

    def venv(self, name):
        path = os.path.join(self.tmp, name)
        run([PY, "-m", "venv", path])
        py = os.path.join(path, "bin", "python")
        out = run([py, "-c", "import sys; print(sys.prefix != sys.base_prefix, "
                   "any('dist-packages' in p for p in sys.path))"], cwd="/")
        self.assertEqual(out.split(), ["True", "False"], "not a clean venv")
        return py

    def wheel(self, name, **extra):
        """A wheel of client/python, built (pip builds in place) in a copy laid out as a
        checkout without a build tree: the built library must not be what makes it work."""
        src = os.path.join(self.tmp, name + "-src")
        shutil.copytree(os.path.join(mftest.ROOT, "client", "python"),
                        os.path.join(src, "client", "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        shutil.copy(os.path.join(mftest.ROOT, "client", "mapflow.h"),
                    os.path.join(src, "client"))
        out = os.path.join(self.tmp, name)
        run([PY, "-m", "pip", "wheel", "--no-index", "--no-build-isolation", "--no-deps",
             "-w", out, os.path.join(src, "client", "python")], cwd=self.tmp,
            env=self.clean_env(**extra))
        whl = glob.glob(os.path.join(out, "mapflow-%s-*.whl" % self.version))
        self.assertEqual(len(whl), 1, os.listdir(out))
        return whl[0]

    def check(self, py, want_lib, pip=True, **env):
        out = run([py, "-c", CHECK, want_lib, self.d.sock, self.row_path, MODEL,
                   str(self.layer), self.hash, self.version, "1" if pip else "0"], cwd="/",
                  env=self.clean_env(**env))
        self.assertTrue(out.startswith("ok "), out)

    def test_pip_wheel_after_make_install(self):
        whl = self.wheel("whl-prefix",
                         PKG_CONFIG_PATH=os.path.join(self.prefix, "lib", "pkgconfig"))
        py = self.venv("venv-pip")
        run([py, "-m", "pip", "install", "--no-index", whl], cwd="/",
            env=self.clean_env())
        self.check(py, os.path.join(self.prefix, "lib", "libmapflow.so.0"))

    def test_make_install_files_on_pythonpath(self):
        py = self.venv("venv-path")
        self.check(py, os.path.join(self.prefix, "lib", "libmapflow.so.0"), pip=False,
                   PYTHONPATH=os.path.join(self.prefix, "lib", "python3", "dist-packages"))

    def test_bundled_library(self):
        whl = self.wheel("whl-bundle", MAPFLOW_BUNDLE="1",
                         MAPFLOW_LIBDIR=os.path.join(self.prefix, "lib"))
        py = self.venv("venv-bundle")
        run([py, "-m", "pip", "install", "--no-index", whl], cwd="/", env=self.clean_env())
        site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   cwd="/").strip()
        self.check(py, os.path.join(site, "mapflow", "libmapflow.so.0"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
