"""``python -m worker.engine.cpu_kernels``: build this machine's CPU kernels (``make setup`` runs it)."""

from worker.engine.cpu_kernels import build, describe

if __name__ == "__main__":
    build(verbose=True)
    print(describe())
