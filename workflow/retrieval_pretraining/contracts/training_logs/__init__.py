"""The training log contract: a trainer's metrics.jsonl (one JSON record per logged step, steps
increasing, every number finite; training.py), the loss curve drawn from it, and the resume state
a trainer keeps in results/state/ while it runs (safetensors tensors are tensors.py's).
"""
