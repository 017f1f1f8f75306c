"""A stand-in for the part of a DeepSpeed engine that learner/update.py uses, over plain SGD, so
the update's arithmetic can be checked against a reference step by step (the real engine is
tested in the e2e and learner-rank tests)."""

from __future__ import annotations

import torch


class SGDEngine:
    """Forward, backward, and an optimizer step at a gradient-accumulation boundary."""

    def __init__(self, model, lr: float):
        self.module = model
        self.opt = self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        self.boundary = True
        self.steps = 0  # optimizer steps taken

    def __call__(self, **kw):
        return self.module(**kw)

    def train(self):
        self.module.train()

    def zero_optimization_stage(self):
        return 0  # whole gradients in p.grad: the update takes their norm itself

    def bfloat16_enabled(self):
        return False

    def set_gradient_accumulation_boundary(self, boundary):
        self.boundary = boundary

    def backward(self, loss):
        loss.backward()

    def step(self):
        if self.boundary:
            self.opt.step()
            self.opt.zero_grad()
            self.steps += 1
