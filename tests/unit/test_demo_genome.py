"""The demo's simulated data is deterministic and its truth check scores bowtie2 output."""
import shutil
import subprocess

from tests.conftest import service_unavailable

from delvefs.devtools.demo.genome import (make_reference, reverse_complement, score_sam, simulate_reads,
                                 write_fasta)


def test_reference_and_reads_are_deterministic():
    ref = make_reference(seed=7, length=5000)
    assert ref == make_reference(seed=7, length=5000)
    assert simulate_reads(ref, seed=1, count=20) == simulate_reads(ref, seed=1, count=20)
    assert simulate_reads(ref, seed=1, count=20) != simulate_reads(ref, seed=2, count=20)


def test_read_names_record_their_origin():
    ref = make_reference(seed=3, length=5000)
    fastq = simulate_reads(ref, seed=4, count=50, error_rate=0.0).splitlines()
    for name, seq in zip(fastq[0::4], fastq[1::4]):
        chrom, pos, strand, _ = name[1:].rsplit("_", 3)
        origin = ref[chrom][int(pos) - 1:int(pos) - 1 + len(seq)]
        assert (seq if strand == "+" else reverse_complement(seq)) == origin


def test_score_sam_counts_unaligned_wrong_and_secondary():
    sam = "\n".join([
        "@HD\tVN:1.0",
        "chr1_100_+_r0\t0\tchr1\t101\t42\t100M\t*\t0\t0\tA\tI",   # correct (within tolerance)
        "chr1_500_-_r1\t16\tchr2\t500\t42\t100M\t*\t0\t0\tA\tI",  # wrong chromosome
        "chr2_9_+_r2\t4\t*\t0\t0\t*\t*\t0\t0\tA\tI",              # unaligned
        "chr2_9_+_r2\t256\tchr2\t9\t0\t100M\t*\t0\t0\tA\tI",      # secondary: ignored
    ])
    score = score_sam(sam)
    assert (score.reads, score.aligned, score.correct) == (3, 2, 1)


def test_bowtie2_aligns_simulated_reads_to_their_origin(tmp_path):
    if not shutil.which("bowtie2"):
        service_unavailable("bowtie2 missing (installed by scripts/bootstrap.sh)")
    ref = make_reference(seed=11, length=20_000)
    write_fasta(ref, tmp_path / "ref.fa")
    (tmp_path / "reads.fastq").write_text(simulate_reads(ref, seed=12, count=200))
    subprocess.run(["bowtie2-build", "-q", str(tmp_path / "ref.fa"), str(tmp_path / "ref")], check=True)
    sam = subprocess.run(["bowtie2", "--no-unal", "-x", str(tmp_path / "ref"), "-U", str(tmp_path / "reads.fastq")],
                         check=True, capture_output=True, text=True).stdout
    score = score_sam(sam)
    assert score.aligned >= 190 and score.correct >= 190
