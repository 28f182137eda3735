output "name" {
  description = "Bucket name (a reference: whatever uses it waits for the bucket)."
  value       = aws_s3_bucket.this.bucket
}

output "arn" {
  description = "ARN of the bucket, for policies."
  value       = aws_s3_bucket.this.arn
}
