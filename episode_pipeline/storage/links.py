"""Links a person can open in a browser for objects and folders of the data bucket.

An `s3://` URI opens nothing in a browser. Locally a link is the moto endpoint itself (path
style): a folder opens as its XML listing, and an object as a presigned GET (moto refuses
unsigned object reads; the signature lasts S3's maximum of 7 days, longer than the local stack's
port does). On AWS a link is the S3 console page of the object or folder: a presigned URL would
expire long before the Dagster metadata that shows it, while the console asks the operator to
sign in and then applies their own permissions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

CONSOLE = "https://console.aws.amazon.com/s3"
MAX_PRESIGN_SECONDS = 7 * 24 * 3600  # S3's limit for a SigV4 presigned URL


@dataclass(frozen=True)
class BucketLinks:
    """Browser links into one bucket: the local endpoint when there is one, else the console."""

    bucket: str
    region: str
    endpoint_url: str | None = None  # the moto server locally; None on AWS
    client: Any = None  # the bucket's boto3 client, to presign local object links

    def object(self, key: str) -> str:
        if self.endpoint_url:
            if self.client is None:
                return f"{self.endpoint_url.rstrip('/')}/{self.bucket}/{quote(key)}"
            return self.client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": key},
                ExpiresIn=MAX_PRESIGN_SECONDS,
            )
        query = urlencode({"region": self.region, "bucketType": "general", "prefix": key})
        return f"{CONSOLE}/object/{quote(self.bucket)}?{query}"

    def folder(self, prefix: str) -> str:
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        if self.endpoint_url:
            return f"{self.endpoint_url.rstrip('/')}/{self.bucket}?{urlencode({'prefix': prefix})}"
        query = urlencode(
            {
                "region": self.region,
                "bucketType": "general",
                "prefix": prefix,
                "showversions": "false",
            }
        )
        return f"{CONSOLE}/buckets/{quote(self.bucket)}?{query}"
