"""Checks a Prometheus text exposition (format 0.0.4) the way a scraper would, stdlib
only, plus MapFlow's naming rules (mapflowd_ prefix, or process_ for the standard process families;
_total on counters; a build_info).

    promcheck.py FILE                         validate; exit 1 with the reasons
    promcheck.py --delta OLD NEW EXPR...      EXPR: 'series=N' or 'series>N' on NEW-OLD
"""
import math
import re
import sys

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(r"^(%s)(\{(?:%s)(?:,%s)*,?\}|\{\})?[ \t]+(\S+)(?:[ \t]+-?\d+)?$"
                    % (NAME, LABEL, LABEL))
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_value(s):
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    return float(s)


def labels_of(s):
    return tuple(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', s or ""))


def parse(text):
    """Returns ({series: value}, [errors])."""
    errs, types, series = [], {}, {}
    if not text.endswith("\n"):
        errs.append("the exposition does not end with a newline")
    for n, line in enumerate(text.split("\n")[:-1], 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] == "TYPE":
                if len(parts) != 4 or parts[3] not in TYPES:
                    errs.append("line %d: bad TYPE line" % n)
                elif parts[2] in types:
                    errs.append("line %d: second TYPE for %s" % (n, parts[2]))
                elif any(k == parts[2] or k.startswith(parts[2] + "{") for k in series):
                    errs.append("line %d: TYPE after samples of %s" % (n, parts[2]))
                else:
                    types[parts[2]] = parts[3]
            elif len(parts) >= 2 and parts[1] == "HELP" and len(parts) < 3:
                errs.append("line %d: HELP without a metric name" % n)
            continue
        m = SAMPLE.match(line)
        if not m:
            errs.append("line %d: not a sample: %r" % (n, line))
            continue
        name, lab, val = m.group(1), m.group(2), m.group(3)
        try:
            v = parse_value(val)
        except ValueError:
            errs.append("line %d: bad value %r" % (n, val))
            continue
        family = name
        for suf in ("_bucket", "_sum", "_count"):
            if name.endswith(suf) and types.get(name[: -len(suf)]) == "histogram":
                family = name[: -len(suf)]
        if family not in types:
            errs.append("line %d: %s has no TYPE before it" % (n, name))
        if not name.startswith(("mapflowd_", "process_")):
            errs.append("line %d: %s lacks the mapflowd_ prefix" % (n, name))
        if types.get(family) == "counter" and not name.endswith("_total"):
            errs.append("line %d: counter %s does not end in _total" % (n, name))
        key = name + ("{%s}" % ",".join('%s="%s"' % kv for kv in labels_of(lab)) if lab and lab != "{}" else "")
        if key in series:
            errs.append("line %d: duplicate series %s" % (n, key))
        series[key] = v
    errs += check_histograms(types, series)
    if not any(k.startswith("mapflowd_build_info") for k in series):
        errs.append("no mapflowd_build_info")
    return series, errs


def check_histograms(types, series):
    errs = []
    for fam, t in types.items():
        if t != "histogram":
            continue
        groups = {}
        for key, v in series.items():
            if not key.startswith(fam + "_bucket"):
                continue
            labs = labels_of(key[len(fam + "_bucket"):])
            le = dict(labs).get("le")
            rest = tuple(kv for kv in labs if kv[0] != "le")
            groups.setdefault(rest, []).append((parse_value(le), v))
        if not groups:
            errs.append("histogram %s has no buckets" % fam)
        for rest, buckets in groups.items():
            buckets.sort()
            counts = [c for _, c in buckets]
            if counts != sorted(counts):
                errs.append("histogram %s%s: buckets not cumulative" % (fam, rest))
            if buckets[-1][0] != math.inf:
                errs.append("histogram %s%s: no +Inf bucket" % (fam, rest))
            suffix = "{%s}" % ",".join('%s="%s"' % kv for kv in rest) if rest else ""
            count = series.get(fam + "_count" + suffix)
            if count is None or fam + "_sum" + suffix not in series:
                errs.append("histogram %s%s: missing _sum or _count" % (fam, rest))
            elif count != buckets[-1][1]:
                errs.append("histogram %s%s: +Inf bucket %g != _count %g"
                            % (fam, rest, buckets[-1][1], count))
    return errs


def main(argv):
    if argv[1:2] == ["--delta"]:
        old, _ = parse(open(argv[2]).read())
        new, _ = parse(open(argv[3]).read())
        bad = 0
        for expr in argv[4:]:
            m = re.match(r"^(.*?)([=>])(-?[\d.]+)$", expr)
            key, op, want = m.group(1), m.group(2), float(m.group(3))
            if key not in new:
                print("missing series %s" % key)
                bad += 1
                continue
            d = new[key] - old.get(key, 0.0)
            if (op == "=" and d != want) or (op == ">" and not d > want):
                print("%s changed by %g, expected %s%g" % (key, d, op, want))
                bad += 1
        return 1 if bad else 0
    _, errs = parse(open(argv[1]).read())
    for e in errs[:30]:
        print(e)
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
