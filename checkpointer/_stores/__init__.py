"""Where checkpoints live: the store protocols (``base``) and every store.

``atomic`` is the one module that calls fsync, ``safefs`` opens files under a
root, ``flock`` locks a key on a local disk, ``encoding`` and ``envelopes``
turn states into bytes; ``files``, ``summaries``, ``journal/``, ``postgres/``
and ``s3/`` are the stores.  Stores are synchronous and never print.
"""
