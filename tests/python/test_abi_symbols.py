"""libmapflow.so exports exactly the functions its installed headers declare.

The installed headers are client/mapflow.h and the proto/ headers it re-exports
(mf_status.h, mf_hash.h, mf_row.h). Their function declarations are read here with a
small C-aware scan (comments, preprocessor lines, C++ guards and brace bodies removed;
static inline functions skipped), independently of the sed in client/client.mk that
writes the linker version script, and compared with `nm -D --defined-only`: nothing
missing (a declared function without a definition), nothing extra (generated protobuf
code, frame/codec internals), no data symbols, every symbol in the MAPFLOW_0 version node.
Env: MF_BUILD (build dir).
"""
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mftest  # noqa: E402

HEADERS = ["client/mapflow.h", "proto/mf_status.h", "proto/mf_hash.h", "proto/mf_row.h"]
SO = os.path.join(mftest.BUILD, "lib", "libmapflow.so.0")


def declared_functions(text):
    """Names of the non-static functions a C header declares."""
    s = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    s = re.sub(r"//[^\n]*", " ", s)
    s = re.sub(r"#ifdef __cplusplus.*?#endif", " ", s, flags=re.S)
    s = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", " ", s, flags=re.M)
    top, depth = [], 0
    for ch in s:  # keep top level only: struct/enum members and inline bodies go
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                top.append(";")  # an inline body ends a declaration without a ';'
        elif depth == 0:
            top.append(ch)
    names = set()
    for stmt in "".join(top).split(";"):
        stmt = " ".join(stmt.split())
        head = stmt.split("(")[0].split()
        if not head or head[0] in ("typedef", "static", "extern"):
            continue
        m = re.match(r"^[\w\s*]*?\b(mf_\w+)\s*\(", stmt)
        if m:
            names.add(m.group(1))
    return names


def exported(path):
    """{name: (type, version)} of the defined dynamic symbols."""
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True,
                         capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        typ, name = parts[-2], parts[-1]
        base, _, ver = name.partition("@")
        syms[base] = (typ, ver.lstrip("@"))
    return syms


class AbiSymbolsTest(unittest.TestCase):
    def test_scanner_sees_what_it_must(self):
        # The scan itself, on a header shaped like ours: a declaration after an inline
        # body, a multi-line one, a typedef'd function pointer and a struct member.
        got = declared_functions("""
            #ifdef __cplusplus
            extern "C" {
            #endif
            #define MF_X(a) \\
                mf_not_a_function(a)
            typedef struct s { int (*mf_member)(void); } s_t;
            typedef void (*mf_cb_t)(int);
            static inline int mf_inline(int a) { if (a) { return 1; } return 0; }
            float mf_after_inline(int a);
            MF_EXPORT const char *mf_multi(const char *a,
                                           int b); /* mf_in_comment(x) */
            #ifdef __cplusplus
            }
            #endif
            """)
        self.assertEqual(got, {"mf_after_inline", "mf_multi"})

    def test_exports_are_the_declared_api(self):
        declared = set()
        for h in HEADERS:
            with open(os.path.join(mftest.ROOT, h)) as f:
                declared |= declared_functions(f.read())
        self.assertGreater(len(declared), 60)
        syms = exported(SO)
        funcs = {n for n, (t, _) in syms.items() if t in ("T", "W", "i")}
        others = {n: t for n, (t, _) in syms.items() if n not in funcs}
        missing, extra = sorted(declared - funcs), sorted(funcs - declared)
        self.assertEqual(missing, [], "declared in %s but not exported" % ", ".join(HEADERS))
        self.assertEqual(extra, [], "exported but declared in no installed header")
        self.assertEqual(others, {"MAPFLOW_0": "A"}, "data or other non-function symbols")
        self.assertEqual({v for n, (_, v) in syms.items() if n in funcs}, {"MAPFLOW_0"})
        print("libmapflow exports %d functions = the %d declared in %s" % (
            len(funcs), len(declared), ", ".join(HEADERS)))


if __name__ == "__main__":
    unittest.main(verbosity=2)
