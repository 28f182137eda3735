"""S3 for the core: boto3 clients made one way, the data bucket, browser links to its objects."""
