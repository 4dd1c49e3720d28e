"""The side-by-side speed harness: fairseq fconv vs this plugin's convs2s (python -m benchmarks.run)."""
