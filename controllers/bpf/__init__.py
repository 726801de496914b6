"""The BPF patch panel and time-flow table: tc programs whose dark windows the kernel times."""
