"""Per-sample statistics of benchmarks/pipeline/Snakefile (run by Snakemake's ``script:``):
the reads (count, bases, GC, mean quality) and what flagstat and idxstats say, as JSON."""
import gzip
import json


def read_stats(paths):
    reads = bases = gc = qual = 0
    for path in paths:
        with gzip.open(path, "rb") as f:
            for i, line in enumerate(f):
                line = line.rstrip(b"\n")
                if i % 4 == 1:
                    reads += 1
                    bases += len(line)
                    gc += line.count(b"G") + line.count(b"C")
                elif i % 4 == 3:
                    qual += sum(line) - 33 * len(line)
    return {"reads": reads, "bases": bases, "gc": round(gc / max(bases, 1), 6),
            "mean_quality": round(qual / max(bases, 1), 4)}


def flagstat(path):
    """The first number of each flagstat line, by what the line says."""
    out = {}
    with open(path) as f:
        for line in f:
            passed, _, rest = line.partition(" + ")
            what = rest.split(" ", 1)[1].split("(")[0].strip()
            out[what] = int(passed)
    return out


def idxstats(path):
    contigs = {}
    with open(path) as f:
        for line in f:
            name, length, mapped, unmapped = line.split("\t")
            if name != "*":
                contigs[name] = {"length": int(length), "mapped": int(mapped),
                                 "per_kb": round(int(mapped) / int(length) * 1000, 3)}
    return contigs


fs = flagstat(snakemake.input.flagstat)
result = {"sample": snakemake.wildcards.sample, "fastq": read_stats(snakemake.input.reads),
          "flagstat": fs, "contigs": idxstats(snakemake.input.idxstats),
          "mapped_fraction": round(fs.get("mapped", 0) / max(fs.get("in total", 1), 1), 6)}
with open(snakemake.output[0], "w") as f:
    json.dump(result, f, indent=1, sort_keys=True)
    f.write("\n")
