"""Seeded random nested models for the soak benchmark (no hypothesis: plain numpy draws).

A model is drawn as a *recipe* (structure and shapes), then built with random parameters,
so the components of a mixture and the states of an HMM share one structure (their data
types agree) but not their parameters. Every family appears: leaves ``Gaussian``,
``DiagGaussian``, ``FullGaussian``, ``Categorical``, ``Poisson``, ``Exponential``; internal
``Composite``, ``Mixture``, ``HMM`` and ``Sequence``, nested up to ``max_depth``.
"""

from __future__ import annotations

import numpy as np

from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, Exponential, FullGaussian, Gaussian, Mixture,
                    Poisson, Sequence)

LEAVES = ("Gaussian", "DiagGaussian", "FullGaussian", "Categorical", "Poisson", "Exponential")


def recipe(rng: np.random.Generator, depth: int = 0, max_depth: int = 3, positions: float = 1.0,
           max_positions: float = 40.0) -> tuple:
    """A random structure: ``(family, shape..., children recipes)``.

    ``positions`` is the expected number of this node's rows per root row (the product of
    the sequences' mean lengths above it), kept below ``max_positions`` so a tree's work
    per root row stays bounded.
    """
    internal = depth < max_depth and rng.random() < (0.9 if depth == 0 else 0.45)
    if not internal:
        fam = LEAVES[rng.integers(len(LEAVES))]
        if fam == "DiagGaussian":
            return (fam, int(rng.integers(1, 9)))
        if fam == "FullGaussian":
            return (fam, int(rng.integers(1, 5)))
        if fam == "Categorical":
            return (fam, int(rng.choice([2, 5, 20, 200])))
        return (fam,)
    kinds = ["Composite", "Mixture", "Sequence", "HMM"]
    if positions * 3 > max_positions:
        kinds = ["Composite", "Mixture"]
    kind = kinds[rng.integers(len(kinds))]
    if kind == "Composite":
        k = int(rng.integers(2, 4))
        return (kind, tuple(recipe(rng, depth + 1, max_depth, positions, max_positions) for _ in range(k)))
    if kind == "Mixture":
        return (kind, int(rng.integers(2, 6)), recipe(rng, depth + 1, max_depth, positions, max_positions))
    length = float(rng.uniform(2.0, min(12.0, max_positions / positions)))
    if kind == "Sequence":
        return (kind, length, recipe(rng, depth + 1, max_depth, positions * length, max_positions))
    # HMM: emissions are leaves or a small mixture of leaves
    emission = recipe(rng, max_depth, max_depth) if rng.random() < 0.7 else (
        "Mixture", 2, recipe(rng, max_depth, max_depth))
    return (kind, int(rng.integers(2, 5)), length, emission)


def build(r: tuple, rng: np.random.Generator):
    """A model of recipe ``r`` with random parameters."""
    fam = r[0]
    if fam == "Gaussian":
        return Gaussian(float(rng.normal(0, 3)), float(rng.uniform(0.3, 3)))
    if fam == "DiagGaussian":
        d = r[1]
        return DiagGaussian(rng.normal(0, 3, d), rng.uniform(0.3, 3, d))
    if fam == "FullGaussian":
        d = r[1]
        a = rng.normal(size=(d, d))
        return FullGaussian(rng.normal(0, 3, d), a @ a.T / d + np.eye(d) * 0.5)
    if fam == "Categorical":
        return Categorical(rng.dirichlet(np.ones(r[1])))
    if fam == "Poisson":
        return Poisson(float(rng.uniform(0.5, 20)))
    if fam == "Exponential":
        return Exponential(float(rng.uniform(0.2, 5)))
    if fam == "Composite":
        return Composite([build(c, rng) for c in r[1]])
    if fam == "Mixture":
        k, child = r[1], r[2]
        return Mixture([build(child, rng) for _ in range(k)], rng.dirichlet(np.full(k, 3.0)))
    if fam == "Sequence":
        return Sequence(build(r[2], rng), r[1])
    if fam == "HMM":
        k, length, emission = r[1], r[2], r[3]
        trans = rng.dirichlet(np.ones(k), size=k) + np.eye(k) * 2
        return HMM([build(emission, rng) for _ in range(k)], trans / trans.sum(axis=1, keepdims=True),
                   rng.dirichlet(np.ones(k)), length)
    raise ValueError(f"unknown recipe {r!r}")


def random_model(seed: int, max_depth: int = 3):
    """``(truth, start)``: two models of one random structure, the data's and EM's start."""
    rng = np.random.default_rng(seed)
    r = recipe(rng, max_depth=max_depth)
    return build(r, rng), build(r, rng)
