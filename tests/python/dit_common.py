"""What every dit_<model>.py of test_diffusers.py shares."""
import torch


def randomized(model, big=False):
    """model with every weight random (diffusers zero-initializes some layers: gates, tables,
    Mochi's pos_frequencies), small enough for bf16 to stay finite through the blocks."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02 if big else 0.05)
    return model
