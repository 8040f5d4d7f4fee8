#!/usr/bin/env python3
"""prom_check.py -- parse and check Prometheus text exposition format 0.0.4
(https://prometheus.io/docs/instrumenting/exposition_formats/), written
here from the format's description, for tests/cluster.sh.

    prom_check.py METRICS.txt [--stats STATS.json] [--ignore NAME ...]
                  [--expect 'NAME{k="v"}=VALUE' ...]

Checks every line: comments (# HELP, # TYPE), samples `name{labels} value`
with valid metric and label names, quoted label values with only \\\\, \\"
and \\n escapes, numeric values; one TYPE and one HELP per family, before
its samples, which come together; counters not negative; for histograms,
buckets with `le`, cumulative, ending at +Inf equal to _count, and a _sum,
per set of the other labels (a labelled histogram is one series per set).
With --stats (the output of `apollo-client stats --json`), every sample of
the text must be in it with the same value and vice versa (families named
by --ignore excepted: they change between the two reads).  --expect checks
a sample's value.  Exits 1 with the reason on the first problem; prints
the number of families and samples otherwise.
"""
import json
import math
import re
import sys

NAME = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*$')
LABEL = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*$')
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def fail(lineno, why):
    sys.exit("prom_check: line %d: %s" % (lineno, why))


def parse_value(s, lineno):
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    try:
        return float(s)
    except ValueError:
        fail(lineno, "value %r is not a number" % s)


def parse_labels(s, lineno):
    """s starts after '{'; returns (labels dict, rest after '}')."""
    labels = {}
    i = 0
    while True:
        if s[i:i + 1] == "}":
            return labels, s[i + 1:]
        m = re.match(r'([a-zA-Z_][a-zA-Z0-9_]*)="', s[i:])
        if not m:
            fail(lineno, "bad label at %r" % s[i:i + 20])
        name = m.group(1)
        i += m.end()
        val = []
        while True:
            if i >= len(s):
                fail(lineno, "unterminated label value")
            c = s[i]
            if c == "\\":
                n = s[i + 1:i + 2]
                if n not in ("\\", '"', "n"):
                    fail(lineno, "bad escape \\%s in a label value" % n)
                val.append("\n" if n == "n" else n)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                fail(lineno, "newline in a label value")
            else:
                val.append(c)
                i += 1
        if name in labels:
            fail(lineno, "label %s twice" % name)
        labels[name] = "".join(val)
        if s[i:i + 1] == ",":
            i += 1
        elif s[i:i + 1] != "}":
            fail(lineno, "expected , or } after a label")


def family_of(name, types):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and types.get(name[:-len(suffix)]) in ("histogram", "summary"):
            return name[:-len(suffix)]
    return name


def parse(text):
    types, helps, samples, order = {}, {}, [], []
    done = set()
    current = None
    if text and not text.endswith("\n"):
        fail(text.count("\n") + 1, "the text does not end with a newline")
    for lineno, line in enumerate(text.split("\n")[:-1], 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.match(name):
                    fail(lineno, "bad metric name %r" % name)
                table = helps if parts[1] == "HELP" else types
                if name in table:
                    fail(lineno, "a second %s for %s" % (parts[1], name))
                if name in done or (current == name and parts[1] == "TYPE" and
                                    any(s[0] == name for s in samples)):
                    fail(lineno, "%s of %s after its samples" % (parts[1], name))
                if parts[1] == "TYPE":
                    if len(parts) != 4 or parts[3] not in TYPES:
                        fail(lineno, "bad TYPE line")
                    types[name] = parts[3]
                else:
                    h = parts[3] if len(parts) == 4 else ""
                    if re.search(r'\\[^\\n]', h.replace("\\\\", "")):
                        fail(lineno, "bad escape in HELP")
                    helps[name] = h
                if current != name:
                    if current is not None:
                        done.add(current)
                    current = name
                    order.append(name)
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{?)(.*)$', line)
        if not m:
            fail(lineno, "not a sample: %r" % line)
        name, brace, rest = m.groups()
        labels = {}
        if brace:
            labels, rest = parse_labels(rest, lineno)
        fields = rest.split()
        if not rest.startswith(" ") or len(fields) not in (1, 2):
            fail(lineno, "expected ' VALUE [TIMESTAMP]' after %s" % name)
        value = parse_value(fields[0], lineno)
        fam = family_of(name, types)
        if fam != current:
            if fam in done or fam in order:
                fail(lineno, "samples of %s are not together" % fam)
            if current is not None:
                done.add(current)
            current = fam
            order.append(fam)
        if types.get(fam) == "counter" and value < 0:
            fail(lineno, "counter %s is negative" % name)
        samples.append((name, labels, value, fam, lineno))
    check_histograms(types, samples)
    return types, samples


def check_histograms(types, samples):
    """Each histogram, per set of labels other than le (a labelled
    histogram is one series per set): buckets, one _sum, one _count."""
    for fam, t in types.items():
        if t != "histogram":
            continue
        series = {}
        for s in samples:
            if s[0] in (fam + "_bucket", fam + "_count", fam + "_sum"):
                rest = tuple(sorted((k, v) for k, v in s[1].items() if k != "le"))
                series.setdefault(rest, []).append(s)
        if not series:
            fail(0, "histogram %s needs buckets, _sum, _count" % fam)
        for group in series.values():
            check_series(fam, group)


def check_series(fam, group):
    buckets = [s for s in group if s[0] == fam + "_bucket"]
    count = [s for s in group if s[0] == fam + "_count"]
    total = [s for s in group if s[0] == fam + "_sum"]
    if not buckets or len(count) != 1 or len(total) != 1:
        fail(group[0][4], "histogram %s needs buckets, _sum, _count" % fam)
    prev_le, prev = -math.inf, 0
    for name, labels, value, _, lineno in buckets:
        if "le" not in labels:
            fail(lineno, "a bucket of %s without le" % fam)
        le = parse_value(labels["le"], lineno)
        if le <= prev_le or value < prev:
            fail(lineno, "buckets of %s are not increasing and cumulative" % fam)
        prev_le, prev = le, value
    if prev_le != math.inf:
        fail(buckets[-1][4], "the last bucket of %s is not +Inf" % fam)
    if prev != count[0][2]:
        fail(count[0][4], "%s_count %g != the +Inf bucket %g" % (fam, count[0][2], prev))


def key(name, labels):
    return name + "{" + ",".join('%s="%s"' % kv for kv in labels.items()) + "}"


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    text = open(args[0]).read()
    types, samples = parse(text)
    stats, ignore, expect = None, set(), []
    i = 1
    while i < len(args):
        if args[i] == "--stats":
            stats = json.load(open(args[i + 1]))
            i += 2
        elif args[i] == "--ignore":
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                ignore.add(args[i])
                i += 1
        elif args[i] == "--expect":
            expect.append(args[i + 1])
            i += 2
        else:
            sys.exit("prom_check: unknown argument %s" % args[i])
    got = {key(s[0], s[1]): s[2] for s in samples}
    for e in expect:
        k, v = e.rsplit("=", 1)
        if k not in got:
            sys.exit("prom_check: no sample %s" % k)
        if got[k] != float(v):
            sys.exit("prom_check: %s is %g, expected %s" % (k, got[k], v))
    if stats is not None:
        theirs = {}
        for fam, f in stats["metrics"].items():
            if f["type"] != types.get(fam):
                sys.exit("prom_check: %s is a %s in stats --json, a %s here" %
                         (fam, f["type"], types.get(fam)))
            for s in f["samples"]:
                theirs[key(s["name"], s["labels"])] = (s["value"], fam)
        for s in samples:
            if s[3] in ignore:
                continue
            k = key(s[0], s[1])
            if k not in theirs:
                sys.exit("prom_check: %s is not in stats --json" % k)
            if theirs[k][0] != s[2] and not (math.isnan(s[2]) and theirs[k][0] is None):
                sys.exit("prom_check: %s is %g here, %s in stats --json" % (k, s[2], theirs[k][0]))
        for k, (v, fam) in theirs.items():
            if fam not in ignore and k not in got:
                sys.exit("prom_check: %s of stats --json is not in the text" % k)
    print("prom_check: %d families, %d samples, valid%s" %
          (len(types), len(samples), "; the same as stats --json" if stats is not None else ""))


if __name__ == "__main__":
    main()
