"""One command for a lent GPU: the CUDA tests, the training-step throughput of every model x batch x
precision, the two data paths, a one-rank NCCL profile, one UCI-sized epoch end to end and the
trainer's overhead (eager, compiled, CUDA graphs), each step in its own time budget so the whole
check stays under ten minutes; one JSON and one markdown table out.

    python -m benchmarks.gpu_check [--out DIR] [--quick] [--only GROUP,...] [--budget-s S] [--dry-run]

A step that fails, hangs or leaves no figures is recorded with the tail of its output and the check
goes on. Exit code: 0 no step failed, 1 some step failed or timed out (both write the files), 2 no GPU.
"""
# plan.py: the steps and their budgets; runner.py: runs them; figures.py: reads what each left;
# page.py: the markdown; throughput.py: the model x batch x precision matrix in one process;
# machine.py: the machine's description; __main__.py: the command line.
