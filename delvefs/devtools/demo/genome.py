"""Deterministic simulated sequencing data with known truth (no downloads).

A reference of a few chromosomes of random bases; reads sampled from it on both
strands with substitution errors. Each read's name records where it came from
(``<chrom>_<pos>_<strand>_<n>``, ``pos`` 1-based), so an alignment can be checked
against the truth without any side file.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

BASES = "ACGT"
COMPLEMENT = str.maketrans("ACGT", "TGCA")
POSITION_TOLERANCE = 5  # aligners may soft-clip an erroneous read end


def reverse_complement(seq: str) -> str:
    return seq.translate(COMPLEMENT)[::-1]


def make_reference(seed: int, chromosomes: int = 2, length: int = 60_000) -> dict[str, str]:
    rng = random.Random(seed)
    return {f"chr{i + 1}": "".join(rng.choices(BASES, k=length)) for i in range(chromosomes)}


def write_fasta(reference: dict[str, str], path: Path) -> None:
    with open(path, "w") as out:
        for name, seq in reference.items():
            out.write(f">{name}\n")
            for i in range(0, len(seq), 70):
                out.write(seq[i:i + 70] + "\n")


def simulate_reads(reference: dict[str, str], seed: int, count: int, read_length: int = 100,
                   error_rate: float = 0.01, tag: str = "r") -> str:
    """FASTQ text of ``count`` reads; names encode their origin."""
    rng = random.Random(seed)
    chroms = sorted(reference)
    lines = []
    for n in range(count):
        chrom = rng.choice(chroms)
        seq = reference[chrom]
        pos = rng.randrange(0, len(seq) - read_length)
        read = list(seq[pos:pos + read_length])
        for i in range(read_length):
            if rng.random() < error_rate:
                read[i] = rng.choice([b for b in BASES if b != read[i]])
        read = "".join(read)
        strand = "+"
        if rng.random() < 0.5:
            read, strand = reverse_complement(read), "-"
        lines += [f"@{chrom}_{pos + 1}_{strand}_{tag}{n}", read, "+", "I" * read_length]
    return "\n".join(lines) + "\n"


@dataclass
class AlignmentScore:
    reads: int = 0
    aligned: int = 0
    correct: int = 0

    @property
    def aligned_pct(self) -> float:
        return 100.0 * self.aligned / self.reads if self.reads else 0.0

    @property
    def correct_pct(self) -> float:
        return 100.0 * self.correct / self.reads if self.reads else 0.0

    def __iadd__(self, other: "AlignmentScore") -> "AlignmentScore":
        self.reads += other.reads
        self.aligned += other.aligned
        self.correct += other.correct
        return self


def score_sam(sam_text: str) -> AlignmentScore:
    """Compare primary alignments in SAM text with the origins in the read names."""
    score = AlignmentScore()
    for line in sam_text.splitlines():
        if not line or line.startswith("@"):
            continue
        fields = line.split("\t")
        flag = int(fields[1])
        if flag & 0x900:  # secondary / supplementary
            continue
        score.reads += 1
        if flag & 0x4:
            continue
        score.aligned += 1
        chrom, pos, _strand, _n = fields[0].rsplit("_", 3)
        if fields[2] == chrom and abs(int(fields[3]) - int(pos)) <= POSITION_TOLERANCE:
            score.correct += 1
    return score
