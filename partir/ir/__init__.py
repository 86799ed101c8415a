"""The program IR: tracing, factor rules, propagation, cost model, devices."""
