"""Demo presets, as data. ``cpu`` (the default) finishes in a few minutes on 2 cores and
shows learning; ``gpu`` is the real comparison on one H200."""

PRESETS = {
    "cpu": dict(
        d_model=64, n_layers=2, n_heads=4, context=64, batch_size=32, steps=500, eval_every=50,
        eval_batches=8, lr=3e-3, block_size=16, density=0.25, corpus_bytes=4_000_000,
        lstm_embed=32, lstm_hidden=128,
    ),
    "gpu": dict(
        # dropout 0.1: 3000 steps of 64 x 256 bytes are ~5 epochs of the 10 MB stdlib
        # corpus; without it both models overfit after ~2250 steps (H200 run, 2026-11-29)
        d_model=512, n_layers=6, n_heads=8, context=256, batch_size=64, steps=3000, eval_every=250, dropout=0.1,
        eval_batches=32, lr=1e-3, block_size=64, density=0.25, corpus_bytes=None,
        lstm_embed=64, lstm_hidden=1024,
    ),
}
