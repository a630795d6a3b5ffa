"""A lean sequential Kalman filter for the dense GPU benchmark: the strongest plain loop peer.

``kalmanscan.dense.sequential.filter_moments`` is the library's reference loop: it handles
diffuse directions, missing entries and the exact diffuse log-likelihood, and launches many
small kernels a step (about 0.8 ms a step on an H200). A user who needs none of that would write
this loop instead: covariance form, a proper prior, time-invariant matrices, no missing data,
the same outputs as the scan (filtered means, covariances and the log-likelihood), and on CUDA
its steps captured in a CUDA graph (``graph_steps`` steps a graph, replayed), so that a step
costs its kernels and not Python and launches.

    from dense_loop import lean_filter
    mean, cov, loglik = lean_filter(z, F, Q, H, R, m0, P0, graph_steps=256)
"""

from __future__ import annotations

import math

import torch


def _step(z, F, Q, H, R, m, P, out_m, out_P, ll):
    """One predict-update step in place: ``m, P`` the state, ``ll`` the running log-likelihood
    (0-d), ``out_m, out_P`` where the filtered moments go. Ops only: capturable."""
    d = H.shape[0]
    mp = F @ m
    Pp = F @ P @ F.T + Q
    HP = H @ Pp  # [d, n]
    S = HP @ H.T + R  # [d, d]
    v = z - H @ mp
    if d == 1:  # scalar innovation: no factorization
        s = S.reshape(())
        K = HP.T / s  # [n, 1]
        quad = v.reshape(()) ** 2 / s
        logdet = torch.log(s)
    else:
        Lc, _ = torch.linalg.cholesky_ex(S)  # no error check: no host synchronization
        K = torch.cholesky_solve(HP, Lc).T
        w = torch.cholesky_solve(v[:, None], Lc)[:, 0]
        quad = v @ w
        logdet = 2.0 * torch.log(torch.diagonal(Lc)).sum()
    m.copy_(mp + K @ v)
    P.copy_(Pp - K @ HP)
    ll.sub_(0.5 * (quad + logdet + d * math.log(2.0 * math.pi)))
    out_m.copy_(m)
    out_P.copy_(P)


def lean_filter(z, F, Q, H, R, m0, P0, graph_steps=0):
    """Filter ``z [T, d]`` with ``x_t = F x_{t-1} + N(0, Q)``, ``z_t = H x_t + N(0, R)`` and prior
    ``x_0 ~ N(m0, P0)`` (the convention of ``kalmanscan.dense``). Returns ``(mean [T, n], cov [T, n, n],
    loglik)``. ``graph_steps > 0`` on CUDA: capture that many steps in one CUDA graph and replay
    it over the series (the remainder runs eagerly)."""
    T, d = z.shape
    n = F.shape[0]
    mean = torch.empty(T, n, dtype=z.dtype, device=z.device)
    cov = torch.empty(T, n, n, dtype=z.dtype, device=z.device)
    m = m0.clone()
    P = P0.clone()
    ll = torch.zeros((), dtype=z.dtype, device=z.device)
    t = 0
    K = graph_steps if (graph_steps > 0 and z.is_cuda) else 0
    if K and T >= K:
        zbuf = torch.empty(K, d, dtype=z.dtype, device=z.device)
        mbuf = torch.empty(K, n, dtype=z.dtype, device=z.device)
        Pbuf = torch.empty(K, n, n, dtype=z.dtype, device=z.device)
        zbuf.copy_(z[:K])
        # warm up on a side stream (the allocator and cuBLAS handles), as CUDA graphs require
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            m_w, P_w, ll_w = m.clone(), P.clone(), ll.clone()
            for k in range(2):
                _step(zbuf[k], F, Q, H, R, m_w, P_w, mbuf[k], Pbuf[k], ll_w)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for k in range(K):
                _step(zbuf[k], F, Q, H, R, m, P, mbuf[k], Pbuf[k], ll)
        while T - t >= K:
            zbuf.copy_(z[t : t + K])
            graph.replay()
            mean[t : t + K].copy_(mbuf)
            cov[t : t + K].copy_(Pbuf)
            t += K
    for s in range(t, T):
        _step(z[s], F, Q, H, R, m, P, mean[s], cov[s], ll)
    return mean, cov, ll
