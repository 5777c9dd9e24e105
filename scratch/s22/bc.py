import sys
sys.path.insert(0, ".")
if __name__ == "__main__":
    import torch
    torch.set_num_threads(1)
    from pathlib import Path
    from benchmarks.imagination_estimated_state import bc_stage
    print(bc_stage(Path("runs/s22"), ()))
