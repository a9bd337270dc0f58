"""Match cost per object: compiled matcher (C) vs the pure-Python reference.

Runs 100, 1,000 and 10,000 views of realistic variety over 100,000 objects with
sequencing-run keys, for two mixes of views: "classic" (prefix and suffix globs, size,
property and relative-age rules) and "rich" (the same plus brace alternatives, numeric
comparisons, `tags`/`metadata` rules and `any`/`not` blocks). The C matcher matches every
object (match_batch in batches of 1,000, as the handler does, and single match() calls),
and answers the handler's tag pre-test (tags_could_matter_batch, same batches); the
reference tests every view per object, so it is timed on a sample of the objects.
Usage: .venv/bin/python benchmarks/bench_matcher.py [--objects N]
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import time

from rulesets import ObjectInfo, View, compile_views, parse_views
from rulesets import reference

BUCKETS = ["runs", "runs-2025", "runs-2026", "genomes", "archive", "scratch", "lab-a", "lab-b"]
EXTENSIONS = ["fastq", "fastq.gz", "bam", "bai", "vcf", "txt"]
NOW = 1_780_000_000.0


def make_views(count: int, rng: random.Random, rich: bool = False) -> list[View]:
    lines = []
    for i in range(count):
        run, lane, sample = rng.randrange(200), rng.randrange(1, 9), rng.randrange(400)
        objects = [
            f"run{run}/lane{lane}/*.fastq",
            f"run{run}/*_R{rng.randrange(1, 3)}.fastq",
            f"run{run}/lane{lane}/sample_{sample:03d}_*",
            f"*.{rng.choice(EXTENSIONS)}",
            f"*/sample_{sample:03d}_R1.fastq",
            f"run{run}/*",
            None,
        ]
        if rich:
            objects += [f"run{run}/lane{{{lane},{lane + 1}}}/*.{{fastq,fastq.gz}}", "*.{bam,bai}",
                        f"run{{{run},{run + 1}}}/*_R{{1,2}}.fastq*"]
        obj = rng.choice(objects)
        rules = [f"v{i}:", f"  bucket: '{rng.choice(BUCKETS)}'"]
        if obj is not None:
            rules.append(f"  object: '{obj}'")
        if rng.random() < 0.3:
            rules.append(f"  size: '{rng.choice(['>= 1 MiB', '< 100 KiB', '1 KiB .. 4 GiB'])}'")
        if rng.random() < 0.3:
            rules.append("  properties: " + rng.choice([
                "{stage: [raw, trimmed]}", "{lane: 3}", "{sample: 'S1*'}", "{stage: raw, reviewed: ~}"]
                + (["{lane: '>= 3'}", "{score: '0.5 .. 1'}", "{sample: 'S{1,2}*'}"] if rich else [])))
        if rng.random() < 0.1:
            rules.append(f"  modified: '{rng.choice(['< 7d', '> 12h', '1d .. 30d'])}'")
        if rich:
            if rng.random() < 0.3:
                rules.append("  " + rng.choice(["tags: {stage: raw}", "metadata: {lane: '< 5'}",
                                                "metadata: {sample: 'S2*'}", "tags: {keep: [yes, ~]}"]))
            if rng.random() < 0.3:
                rules.append("  any: " + rng.choice([
                    "[{size: '> 1 GiB'}, {tags: {keep: 'yes'}}]",
                    "[{object: '*_R1.*'}, {metadata: {score: '> 0.9'}}]",
                    "[{modified: '< 7d'}, {size: '< 1 KiB'}]"]))
            if rng.random() < 0.3:
                rules.append("  not: " + rng.choice([
                    "{object: '*/tmp/*'}", "{metadata: {qc: failed}}", "[{tags: {stage: aligned}}, {size: 0}]"]))
        lines.extend(rules)
    return parse_views("\n".join(lines) + "\n", "bench.yaml")


def make_objects(count: int, rng: random.Random) -> list[ObjectInfo]:
    objects = []
    for _ in range(count):
        key = (f"run{rng.randrange(200)}/lane{rng.randrange(1, 9)}/sample_{rng.randrange(400):03d}"
               f"_R{rng.randrange(1, 3)}.{rng.choice(EXTENSIONS)}")
        tags = {"stage": rng.choice(["raw", "trimmed", "aligned"])} if rng.random() < 0.5 else {}
        if rng.random() < 0.2:
            tags["keep"] = "yes"
        metadata = {"Sample": f"S{rng.randrange(30)}", "lane": str(rng.randrange(1, 9))} if rng.random() < 0.3 else {}
        if rng.random() < 0.3:
            metadata["score"] = f"{rng.random():.3f}"
        if rng.random() < 0.05:
            metadata["qc"] = "failed"
        objects.append(ObjectInfo(rng.choice(BUCKETS[:5]), key, rng.randrange(10**10),
                                  NOW - rng.uniform(0, 60 * 86400), None, tags, metadata))
    return objects


def per_object_us(func, objects, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        func(objects)
        best = min(best, time.perf_counter() - start)
    return best / len(objects) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=100_000)
    args = parser.parse_args()
    rng = random.Random(42)
    objects = make_objects(args.objects, rng)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, {len(objects):,} objects")
    print(f"{'views':>13} | {'C batch µs/obj':>14} | {'C match() µs/obj':>16} | {'tag pre-test µs/obj':>19} "
          f"| {'reference µs/obj':>16} | {'ref sample':>10} | {'ref ÷ C':>8} | {'matches/obj':>11}")
    print("-" * 130)
    for rich in (False, True):
        for view_count in (100, 1_000, 10_000):
            views = make_views(view_count, random.Random(view_count), rich)
            matcher = compile_views(views)

            def batched(objs):
                for start in range(0, len(objs), 1000):
                    matcher.match_batch(objs[start:start + 1000], NOW)

            def single(objs):
                for obj in objs:
                    matcher.match(obj, NOW)

            def pretest(objs):
                for start in range(0, len(objs), 1000):
                    matcher.tags_could_matter_batch(objs[start:start + 1000], NOW)

            batched(objects[:1000])  # warm the per-bucket index cache
            c_batch = per_object_us(batched, objects)
            c_single = per_object_us(single, objects, repeat=1)
            c_pretest = per_object_us(pretest, objects)
            sample = objects[: max(50, min(len(objects), 300_000 // view_count))]
            ref = per_object_us(lambda objs: [reference.match(views, o, NOW) for o in objs], sample, repeat=1)
            for obj in sample[:200]:  # the benchmark measures equal work
                assert matcher.match(obj, NOW) == reference.match(views, obj, NOW)
            matches = sum(len(m) for m in matcher.match_batch(objects, NOW)) / len(objects)
            label = f"{'rich' if rich else 'classic'} {view_count:,}"
            print(f"{label:>13} | {c_batch:>14.2f} | {c_single:>16.2f} | {c_pretest:>19.2f} | {ref:>16.1f} "
                  f"| {len(sample):>10,} | {ref / c_batch:>7.0f}× | {matches:>11.2f}")


if __name__ == "__main__":
    main()
