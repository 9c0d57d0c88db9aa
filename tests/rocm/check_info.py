#!/usr/bin/env python3
"""Checks one `ferry-info --json` report (stdin) of the sid-root suite (run_root_suite.sh):
  --major N              runtimes.rocm_major is N
  --source S             runtimes.rocm_source is S;  --source-has S: contains S
  --detail D             runtimes.rocm_detail is D
  --variant rocmN        runtimes.rocm_variant is rocmN;  --no-variant: none was chosen
  --choice-has TEXT      runtimes.rocm_choice contains TEXT
  --hip rocmN=STATE:TEXT rocmN/hip_ipc.so is in STATE and its reason contains TEXT
  --skipped rocmA,rocmB  those variants' hip_ipc.so are variant-skipped
  --skip-reason rocmN=TEXT  and rocmN's reason contains TEXT
  --shadowed rocmA,...   those variants' hip_ipc.so are shadowed (another variant loaded)
  --path rocmN=PATH      rocmN's hip_ipc.so is the file PATH
Prints what differs and exits 1."""
import argparse
import json
import sys

p = argparse.ArgumentParser()
for opt in ("--major", "--source", "--source-has", "--detail", "--variant", "--choice-has", "--skipped", "--shadowed"):
    p.add_argument(opt)
p.add_argument("--no-variant", action="store_true")
p.add_argument("--hip", action="append", default=[])
p.add_argument("--skip-reason", action="append", default=[])
p.add_argument("--path", action="append", default=[])
a = p.parse_args()
text = sys.stdin.read()
try:
    report = json.loads(text)
except ValueError:
    sys.exit("not JSON: " + text[:2000])
rt = report["runtimes"]
hip = {r["variant"]: r for r in report["plugins"] if r["name"] == "hip_ipc"}
problems = []


def expect(what, got, want):
    if got != want:
        problems.append("%s: %r, expected %r" % (what, got, want))


def contains(what, got, part):
    if part not in (got or ""):
        problems.append("%s: %r does not contain %r" % (what, got, part))


if a.major:
    expect("rocm_major", rt["rocm_major"], int(a.major))
if a.source:
    expect("rocm_source", rt["rocm_source"], a.source)
if a.source_has:
    contains("rocm_source", rt["rocm_source"], a.source_has)
if a.detail:
    expect("rocm_detail", rt["rocm_detail"], a.detail)
if a.variant:
    expect("rocm_variant", rt["rocm_variant"], a.variant)
if a.no_variant:
    expect("rocm_variant", rt["rocm_variant"], None)
if a.choice_has:
    contains("rocm_choice", rt["rocm_choice"], a.choice_has)
for spec in a.hip:
    variant, rest = spec.split("=", 1)
    state, part = rest.split(":", 1)
    r = hip.get(variant)
    if not r:
        problems.append("no %s/hip_ipc.so in the report" % variant)
        continue
    expect(variant + "/hip_ipc.so state", r["state"], state)
    contains(variant + "/hip_ipc.so reason", r["reason"], part)
for key, state in (("skipped", "variant-skipped"), ("shadowed", "shadowed")):
    for variant in filter(None, (getattr(a, key) or "").split(",")):
        expect(variant + "/hip_ipc.so state", hip.get(variant, {}).get("state"), state)
for spec in a.skip_reason:
    variant, part = spec.split("=", 1)
    contains(variant + "/hip_ipc.so reason", hip.get(variant, {}).get("reason"), part)
for spec in a.path:
    variant, path = spec.split("=", 1)
    expect(variant + "/hip_ipc.so path", hip.get(variant, {}).get("path"), path)
for line in problems:
    print("  " + line)
sys.exit(1 if problems else 0)
