"""Upload announcements: S3 event parsing, the SQS queue client, the dead-letter queue."""
