"""Tokenizing, truncation flag, length buckets, padding."""

from fixtures import tiny_package

from runtime.text import Encoded, TextEncoder, bucket_for, bucket_lengths, pad_batch


def test_buckets_end_at_max_length():
    assert bucket_lengths(512, (16, 32, 64, 128)) == (16, 32, 64, 128, 512)
    assert bucket_lengths(128, (16, 32, 64, 128)) == (16, 32, 64, 128)
    assert bucket_lengths(24, (16, 32)) == (16, 24)
    assert bucket_lengths(128)[-1] == 128 and bucket_lengths(128)[0] <= 16


def test_bucket_for_picks_smallest_that_fits():
    buckets = (16, 32, 64, 128)
    assert [bucket_for(n, buckets) for n in (1, 16, 17, 64, 65, 128)] == [16, 16, 32, 64, 128, 128]


def test_encoder_truncates_and_reports_it(tiny_package_dir):
    encoder = TextEncoder((tiny_package_dir / "tokenizer.json").read_text(encoding="utf-8"),
                          max_length=tiny_package.MAX_LENGTH, pad_id=0)
    short, long = encoder.tokenize(["rain and sun", " ".join(["goal"] * 100)])
    assert len(short.ids) == 5 and not short.truncated  # [CLS] rain and sun [SEP]
    assert len(long.ids) == tiny_package.MAX_LENGTH and long.truncated
    assert long.ids[-1] == tiny_package.vocabulary()["[SEP]"]  # special tokens survive truncation


def test_pad_batch_pads_with_pad_id_and_masks_padding():
    ids, mask = pad_batch([Encoded((2, 7, 3), False), Encoded((2, 3), False)], length=4, pad_id=9)
    assert ids.tolist() == [[2, 7, 3, 9], [2, 3, 9, 9]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert ids.dtype.name == mask.dtype.name == "int64"
