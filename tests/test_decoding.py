"""Decoding: greedy equals transformers' greedy on Hugging Face checkpoints, cached decoding
equals recomputing the whole prefix, beam search and sampling behave."""
import dataclasses

import numpy as np
import pytest

import switchzoo
from switchzoo import zoo

from test_hf import CONFIGS
from conftest import Lazy

torch, transformers = Lazy("torch"), Lazy("transformers")


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.SwitchTransformersForConditionalGeneration(
        transformers.SwitchTransformersConfig(expert_capacity=64, initializer_factor=4.0,
                                 **CONFIGS[request.param])).eval()
    with torch.no_grad():
        # A random model mostly predicts the pad id; a zero row makes the output less trivial.
        model.shared.weight[0] = 0
        model.encoder.embed_tokens.weight.copy_(model.shared.weight)
        model.decoder.embed_tokens.weight.copy_(model.shared.weight)
        if not model.config.tie_word_embeddings:
            model.lm_head.weight[0] = 0
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    rng = np.random.default_rng(1)
    src = rng.integers(2, model.config.vocab_size, (3, 11))
    mask = np.ones_like(src)
    mask[0, 7:] = 0
    return model, switchzoo.from_pretrained(path), src * mask, mask


def uncached_greedy(model, src, mask, steps):
    """Recomputes the whole prefix each step. The decoder input has a fixed length, ``steps``
    (one compile, shared with test_beam_search's scoring of as many tokens: the last token is
    read off the logits of the one before); positions past the prefix are masked padding,
    which causal attention cannot see and routing skips."""
    dec = np.zeros((src.shape[0], steps + 1), np.int32)
    for t in range(steps):
        dec_mask = (np.arange(steps) <= t)[None].repeat(src.shape[0], 0).astype(np.int32)
        logits = np.asarray(model(src, attention_mask=mask, decoder_input_ids=dec[:, :steps],
                                  decoder_attention_mask=dec_mask))
        dec[:, t + 1] = logits[:, t].argmax(-1)
    return dec


def test_greedy_equals_transformers_greedy(checkpoint):
    hf_model, ours, src, mask = checkpoint
    # transformers 5 sizes its cache by the encoder depth, so a decoder deeper than the encoder
    # only generates without a cache there.
    use_cache = hf_model.config.num_decoder_layers <= hf_model.config.num_layers
    with torch.no_grad():
        want = hf_model.generate(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                                 max_new_tokens=8, do_sample=False, num_beams=1,
                                 decoder_start_token_id=0, use_cache=use_cache).numpy()
    # 8 new tokens, as every test below generates: the same compiled program as theirs
    got = ours.generate(src, attention_mask=mask, max_new_tokens=8)
    assert len(set(want[:, 1:].ravel())) >= 3, "the oracle output is too trivial to compare"
    np.testing.assert_array_equal(got[:, :want.shape[1]], want)
    assert np.all(got[:, want.shape[1]:] == 0)


def test_cached_equals_uncached_encoder_decoder(checkpoint):
    _, ours, src, mask = checkpoint
    np.testing.assert_array_equal(ours.generate(src, attention_mask=mask, max_new_tokens=8),
                                  uncached_greedy(ours, src, mask, 8))


def test_cached_equals_uncached_decoder_only():
    cfg = zoo.get("switch_tiny").replace(num_layers=2)     # a dense block's cache, a Switch one's
    # Evaluation capacity high enough that neither path drops tokens (their groups differ).
    cfg = cfg.replace(moe=dataclasses.replace(cfg.moe, eval_capacity_factor=8.0))
    model = switchzoo.init(cfg, seed=3)
    prompt = np.random.default_rng(2).integers(1, 256, (2, 5))
    got = model.generate(prompt, max_new_tokens=10)
    ids = np.concatenate([prompt, np.zeros((2, 10), np.int64)], 1)
    for t in range(5, 15):
        mask = (np.arange(15) < t)[None].repeat(2, 0).astype(np.int32)
        ids[:, t] = np.asarray(model(ids, attention_mask=mask))[:, t - 1].argmax(-1)
    np.testing.assert_array_equal(got, ids)


def test_beam_search(checkpoint):
    _, ours, src, mask = checkpoint
    greedy = ours.generate(src, attention_mask=mask, max_new_tokens=8)
    np.testing.assert_array_equal(ours.generate(src, attention_mask=mask, max_new_tokens=8,
                                                num_beams=1), greedy)
    beam = ours.generate(src, attention_mask=mask, max_new_tokens=8, num_beams=4)
    assert beam.shape == greedy.shape

    def logprob(seq):      # sum of log-probabilities of the generated tokens under the model
        logits = np.asarray(ours(src, attention_mask=mask, decoder_input_ids=seq[:, :-1]))
        top = logits.max(-1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        return np.take_along_axis(logp, seq[:, 1:, None], -1)[..., 0].sum(-1)
    assert np.all(logprob(beam) >= logprob(greedy) - 1e-4)


@pytest.mark.parametrize("checkpoint", ["tied_e4"], indirect=True)   # decoding options, not the model
def test_eos_ends_a_sequence_and_sampling_is_seeded(checkpoint):
    _, ours, src, mask = checkpoint
    greedy = ours.generate(src, attention_mask=mask, max_new_tokens=8)
    eos = int(greedy[1, 2])
    ended = ours.generate(src, attention_mask=mask, max_new_tokens=8, eos_token_id=eos)
    first = int(np.argmax(greedy[1] == eos))
    np.testing.assert_array_equal(ended[1, :first + 1], greedy[1, :first + 1])
    assert np.all(ended[1, first + 1:] == 0)
    a = ours.generate(src, attention_mask=mask, max_new_tokens=8, do_sample=True, seed=5)
    b = ours.generate(src, attention_mask=mask, max_new_tokens=8, do_sample=True, seed=5)
    np.testing.assert_array_equal(a, b)
    top1 = ours.generate(src, attention_mask=mask, max_new_tokens=8, do_sample=True, top_k=1)
    np.testing.assert_array_equal(top1, greedy)


def test_beam_search_equals_an_exhaustive_search_on_a_tiny_vocabulary():
    """With more beams than hypotheses, beam search must return the best of all sequences:
    every sequence of up to T tokens ending in EOS (or, if none ends, T tokens), scored here
    independently by teacher-forced log-probabilities / GNMT's ((5 + length) / 6) ** alpha."""
    V, T, alpha, eos = 5, 3, 0.6, 1
    cfg = zoo.get("t5_tiny").replace(vocab_size=V)
    model = switchzoo.init(cfg, seed=7)
    src = np.array([[2, 3, 4, 2, 1, 0], [4, 4, 2, 3, 3, 1]], np.int32)
    mask = (src != 0).astype(np.int32)
    # Teacher-forced log-probabilities of every token sequence of length T (prefixes included).
    seqs = np.array(np.meshgrid(*[np.arange(V)] * T, indexing="ij")).reshape(T, -1).T   # [V^T, T]
    best = []
    for b in range(src.shape[0]):
        rows = len(seqs)
        dec_in = np.concatenate([np.zeros((rows, 1), np.int32), seqs[:, :-1]], 1)
        logits = np.asarray(model(np.repeat(src[b:b + 1], rows, 0),
                                  attention_mask=np.repeat(mask[b:b + 1], rows, 0),
                                  decoder_input_ids=dec_in), np.float64)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        token_logp = np.take_along_axis(logp, seqs[..., None], -1)[..., 0]        # [V^T, T]
        scored = {}
        for seq, lp in zip(seqs, token_logp):
            ends = [t for t in range(T) if seq[t] == eos]
            length = ends[0] + 1 if ends else T
            out = tuple(seq[:length]) + (0,) * (T - length)
            scored[out] = lp[:length].sum() / ((5.0 + length) / 6.0) ** alpha
        finished = {s: v for s, v in scored.items() if eos in s}
        best.append(max(finished or scored, key=(finished or scored).get))
    got = model.generate(src, attention_mask=mask, max_new_tokens=T, num_beams=64,
                         length_penalty=alpha, eos_token_id=eos)
    np.testing.assert_array_equal(got[:, 1:], np.array(best))


@pytest.mark.parametrize("tied", [True, False])
def test_decoding_head_gives_the_models_own_logits(tied):
    """A decoding loop takes the output layer once as [d_model, vocab] (head_DV) and passes
    it to every step: the same logits as the model's own output layer, tied or not."""
    import jax
    import jax.numpy as jnp
    cfg = zoo.get("switch_tiny").replace(num_layers=2, tie_embeddings=tied)
    model = switchzoo.init(cfg, seed=4).module()
    ids = jnp.asarray(np.random.default_rng(3).integers(1, 256, (2, 3)), jnp.int32)

    @jax.jit
    def both(ids):
        cache = model.init_cache(2, 4)
        own, _ = model.decode(ids, cache, 0)
        given, _ = model.decode(ids, cache, 0, head_DV=model.head_DV())
        return own, given
    own, given = both(ids)
    np.testing.assert_allclose(given, own, rtol=1e-5, atol=1e-5)
    assert float(jnp.std(own)) > 0.1


def test_first_max_is_argmax():
    """Greedy's token: jnp.argmax's answer (the first of tied maxima, the first NaN, a row of
    -inf's first index), by two plain reductions."""
    import jax.numpy as jnp
    from switchzoo.decoding import first_max
    x = np.random.default_rng(0).normal(size=(6, 50)).astype(np.float32)
    x[1, [3, 17, 40]] = 9.0
    x[2, [5, 30]] = np.nan
    x[3] = -np.inf
    x[4, 0] = x[4, 49] = 7.0
    x[5, 12] = np.inf
    np.testing.assert_array_equal(first_max(jnp.asarray(x)), np.argmax(x, -1))
    np.testing.assert_array_equal(first_max(jnp.asarray(x)), jnp.argmax(jnp.asarray(x), -1))
