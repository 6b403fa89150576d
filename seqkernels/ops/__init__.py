"""Functional ops: thin Python over torch.ops.seqkernels with fake functions and autograd."""
