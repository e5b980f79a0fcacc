"""Object storage: checkpoints in an S3 bucket, fenced by conditional PUTs.

* ``client``: the botocore client of a store (one per process), bounded
  calls, errors that name the bucket and the way out, ``probe``;
* ``store``: ``S3Store``, one envelope object per key;
* ``journal``: ``S3JournalStore``, a head object naming immutable segments.

botocore is imported only when a store is made (the ``s3`` extra).
"""
