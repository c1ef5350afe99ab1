"""The production GPU trace benchmark's pure parts: the trace (read, write, synthesize, subset, compress into a
replay) and the report of what a replay measured. No Kubernetes, no network, no clock: the replay driver does those."""
