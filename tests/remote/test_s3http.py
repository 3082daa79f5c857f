"""The S3 client's request signing against AWS's documented SigV4 examples."""

from __future__ import annotations


def test_sigv4_matches_the_aws_documentation_examples():
    """The two signed GETs of AWS's "Signature Calculations for the Authorization Header"
    examples (GET Bucket lifecycle, GET Bucket list objects), byte for byte."""
    import datetime as dt

    from mmpack._src.remote._s3http import sign_v4

    kw = {
        "access_key": "AKIAIOSFODNN7EXAMPLE",
        "region": "us-east-1",
        "secret_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "now": dt.datetime(2013, 5, 24, tzinfo=dt.timezone.utc),
    }
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    host = "examplebucket.s3.amazonaws.com"
    for query, signature in (
        ({"lifecycle": ""}, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
        (
            {"max-keys": "2", "prefix": "J"},
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7",
        ),
    ):
        auth = sign_v4("GET", host, "/", query, {}, empty, **kw)["Authorization"]
        assert auth.endswith(
            f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}"
        )
