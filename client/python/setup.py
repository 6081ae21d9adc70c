"""Build step of the mapflow package (pyproject.toml holds the rest).

- version: the project's VERSION file when the checkout has one, else MF_VERSION_STRING
  of client/mapflow.h (the library's own version), so package and library agree.
- mapflow/_config.py (written into the build, not the source tree): LIBDIRS, where the
  package looks for libmapflow.so.0 after $MAPFLOW_LIB, a bundled copy and the source
  tree: $MAPFLOW_LIBDIR (os.pathsep-separated), `pkg-config --variable=libdir mapflow`
  (a `make install PREFIX=...` whose lib/pkgconfig is on PKG_CONFIG_PATH), and this
  checkout's build/lib when it holds a built library.
- MAPFLOW_BUNDLE=1 copies the first libmapflow.so.0 found there (or $MAPFLOW_LIB) into
  the package, for an install that works without any of those directories.
"""
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SONAME = "libmapflow.so.0"


def version():
    vf = os.path.join(ROOT, "VERSION")
    if os.path.exists(vf):
        with open(vf) as f:
            return f.read().strip()
    header = os.path.join(ROOT, "client", "mapflow.h")
    if not os.path.exists(header):
        raise RuntimeError("mapflow: build the package from client/python of a MapFlow "
                           "checkout (%s is missing)" % header)
    with open(header) as f:
        m = re.search(r'^#define MF_VERSION_STRING "([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("mapflow: no MF_VERSION_STRING in " + header)
    return m.group(1)


def libdirs():
    dirs = [d for d in os.environ.get("MAPFLOW_LIBDIR", "").split(os.pathsep) if d]
    try:
        p = subprocess.run(["pkg-config", "--variable=libdir", "mapflow"],
                           capture_output=True, text=True)
        if p.returncode == 0 and p.stdout.strip():
            dirs.append(p.stdout.strip())
    except OSError:  # no pkg-config: the other places still count
        pass
    tree = os.path.join(ROOT, os.environ.get("MF_BUILD", "build"), "lib")
    if os.path.exists(os.path.join(tree, SONAME)):
        dirs.append(tree)
    out = []
    for d in dirs:
        d = os.path.abspath(d)
        if d not in out:
            out.append(d)
    return out


class BuildPy(build_py):
    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "mapflow")
        dirs = libdirs()
        with open(os.path.join(pkg, "_config.py"), "w") as f:
            f.write("# Written by setup.py: where libmapflow was looked for at build time.\n"
                    "LIBDIRS = %r\n" % (dirs,))
        if os.environ.get("MAPFLOW_BUNDLE") == "1":
            cands = [os.environ.get("MAPFLOW_LIB", "")] + [os.path.join(d, SONAME)
                                                           for d in dirs]
            src = next((c for c in cands if c and os.path.exists(c)), None)
            if src is None:
                raise RuntimeError("MAPFLOW_BUNDLE=1 but no %s in %s" % (SONAME, dirs))
            shutil.copyfile(os.path.realpath(src), os.path.join(pkg, SONAME))


setup(version=version(), cmdclass={"build_py": BuildPy})
