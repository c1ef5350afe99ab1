module reservoir.local/loadgen

go 1.26.0
