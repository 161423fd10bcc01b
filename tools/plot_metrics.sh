#!/bin/sh
# Plots an example's --metrics CSV (step,epoch,split,loss,accuracy,seconds)
# as a PNG with gnuplot: loss against step for each split (train, dev,
# test) and, when the file has accuracies, accuracy on a second axis.
#
#   tools/plot_metrics.sh METRICS.csv OUT.png [TITLE]
#
# gnuplot comes from Debian's gnuplot-nox (`make deps` installs it).
set -eu
if [ $# -lt 2 ]; then
  echo "usage: $0 METRICS.csv OUT.png [TITLE]" >&2
  exit 2
fi
csv=$1
png=$2
title=${3:-$(basename "$csv")}
command -v gnuplot >/dev/null 2>&1 || {
  echo "$0: gnuplot is not installed (make deps installs gnuplot-nox)" >&2
  exit 1
}
[ -r "$csv" ] || { echo "$0: cannot read $csv" >&2; exit 1; }
head -n 1 "$csv" | grep -q '^step,epoch,split,loss,accuracy,seconds$' || {
  echo "$0: $csv is not an example's metrics file (header step,epoch,split,loss,accuracy,seconds)" >&2
  exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One whitespace-separated file per split, so gnuplot needs no CSV filters;
# empty fields become NaN, which gnuplot skips.
for split in train dev test; do
  awk -F, -v s="$split" 'NR > 1 && $3 == s {
      loss = ($4 == "") ? "NaN" : $4; acc = ($5 == "") ? "NaN" : $5;
      print $1, loss, acc }' "$csv" >"$tmp/$split.dat"
done
has_acc=$(awk -F, 'NR > 1 && $5 != "" { print "yes"; exit }' "$csv")
plots=""
for split in train dev test; do
  [ -s "$tmp/$split.dat" ] || continue
  style="lines"
  [ "$split" = train ] || style="linespoints"
  plots="$plots${plots:+, }'$tmp/$split.dat' using 1:2 with $style title '$split loss'"
  if [ -n "$has_acc" ] && [ "$split" != train ]; then
    plots="$plots, '$tmp/$split.dat' using 1:3 axes x1y2 with linespoints dashtype 2 title '$split accuracy'"
  fi
done
[ -n "$plots" ] || { echo "$0: $csv has no rows" >&2; exit 1; }
{
  echo "set terminal png size 960,540 noenhanced"
  echo "set output '$png'"
  echo "set title '$title' noenhanced"
  echo "set xlabel 'step'"
  echo "set ylabel 'loss'"
  echo "set grid"
  echo "set key outside right"
  if [ -n "$has_acc" ]; then
    echo "set y2label 'accuracy'"
    echo "set y2range [0:1]"
    echo "set y2tics"
  fi
  echo "plot $plots"
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
[ -s "$png" ] || { echo "$0: gnuplot wrote no $png" >&2; exit 1; }
echo "$png"
