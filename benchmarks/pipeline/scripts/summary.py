"""The summary of benchmarks/pipeline/Snakefile: one row per sample of its stats."""
import json

stats = [json.load(open(p)) for p in snakemake.input]
contigs = sorted({c for s in stats for c in s["contigs"]})
with open(snakemake.output[0], "w") as f:
    f.write("\t".join(["sample", "reads", "bases", "gc", "mean_quality", "mapped_fraction",
                       *(f"{c}_mapped" for c in contigs)]) + "\n")
    for s in sorted(stats, key=lambda s: s["sample"]):
        q = s["fastq"]
        f.write("\t".join(str(v) for v in [s["sample"], q["reads"], q["bases"], q["gc"], q["mean_quality"],
                                           s["mapped_fraction"],
                                           *(s["contigs"].get(c, {}).get("mapped", 0) for c in contigs)]) + "\n")
