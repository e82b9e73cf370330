"""error6d with a precomputed Error6DReference: bit-identical to the plain call and to the float64 definition."""

import numpy as np
import pytest
import scipy.special
import torch

from kvstats.measure import error6d as E


def _trials(seed: int, *, n_trials=3, hq=4, hkv=2, nq=5, s=11, d=16, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=g).to(dtype)

    q, k, v = randn(n_trials, 2, hq, nq, d), randn(n_trials, 2, hkv, s, d), randn(n_trials, 2, hkv, s, d)
    k_hat, v_hat = k + 0.1 * randn(*k.shape), v + 0.1 * randn(*v.shape)
    est = torch.einsum("tbhnd,tbhsd->tbhns", q, k.repeat_interleave(hq // hkv, 2)) / d**0.5
    return q, k, v, k_hat, v_hat, est + 0.2 * randn(*est.shape)


def _oracle(q, k, v, v_hat, logits_hat, causal):
    """float64 numpy: KL(p ‖ p̂) and ‖o − ô‖/‖o‖ per trial, explicit GQA repeat and causal mask."""
    rep = q.shape[2] // k.shape[2]
    kr, vr, vhr = (np.repeat(x.double().numpy(), rep, axis=2) for x in (k, v, v_hat))
    logits = np.einsum("tbhnd,tbhsd->tbhns", q.double().numpy(), kr) / np.sqrt(q.shape[-1])
    lh = logits_hat.double().numpy().copy()
    if causal:
        nq, s = logits.shape[-2:]
        hidden = np.arange(s)[None, :] > (s - nq + np.arange(nq))[:, None]
        logits[..., hidden], lh[..., hidden] = -np.inf, -np.inf
    p, p_hat = scipy.special.softmax(logits, axis=-1), scipy.special.softmax(lh, axis=-1)
    kl = scipy.special.rel_entr(p, p_hat).sum(-1)
    o, o_hat = p @ vr, p_hat @ vhr
    out = np.linalg.norm(o - o_hat, axis=-1) / np.linalg.norm(o, axis=-1)
    return np.stack([kl.reshape(len(q), -1).mean(1), out.reshape(len(q), -1).mean(1)], axis=1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("estimated", [False, True])
def test_reference_gives_the_same_numbers_as_the_plain_call_and_the_definition(causal, estimated):
    q, k, v, k_hat, v_hat, est = _trials(3 + causal + 2 * estimated)
    ref = E.Error6DReference(q, k, v, causal=causal)
    extra = {"scores_hat": est} if estimated else {}
    plain = E.error6d(q, k, v, k_hat, v_hat, causal=causal, **extra)
    for _ in range(2):  # the reference's cached log p serves a second scheme alike
        assert torch.equal(E.error6d(q, k, v, k_hat, v_hat, causal=causal, reference=ref, **extra), plain)
    logits_hat = est if estimated else torch.einsum(
        "tbhnd,tbhsd->tbhns", q, k_hat.repeat_interleave(2, 2)) / q.shape[-1] ** 0.5
    np.testing.assert_allclose(plain[:, 4:].numpy(), _oracle(q, k, v, v_hat, logits_hat, causal), rtol=1e-10)


def test_reference_for_one_trial_and_fp32_inputs():
    q, k, v, k_hat, v_hat, est = (x[0] for x in _trials(11, dtype=torch.float32))
    for double in (True, False):
        ref = E.Error6DReference(q, k, v, double=double)
        for extra in ({}, {"scores_hat": est}):
            assert torch.equal(E.error6d(q, k, v, k_hat, v_hat, double=double, reference=ref, **extra),
                               E.error6d(q, k, v, k_hat, v_hat, double=double, **extra))


def test_reference_built_for_other_inputs_is_refused():
    q, k, v, k_hat, v_hat, est = _trials(5)
    ref = E.Error6DReference(q, k, v)
    with pytest.raises(ValueError, match="reference was built for q, k, v of shapes"):
        E.error6d(q[:2], k[:2], v[:2], k_hat[:2], v_hat[:2], reference=ref)
    with pytest.raises(ValueError, match="reference was built with causal=False"):
        E.error6d(q, k, v, k_hat, v_hat, causal=True, reference=ref)
    with pytest.raises(TypeError, match="reference must be an Error6DReference, got dict"):
        E.error6d(q, k, v, k_hat, v_hat, reference={})
    with pytest.raises(ValueError, match="scores_hat must have the shape"):
        E.error6d(q, k, v, k_hat, v_hat, scores_hat=est[..., :-1], reference=ref)
