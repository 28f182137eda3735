variable "name" {
  description = "Name of the bucket (globally unique)."
  type        = string
}

variable "expiry" {
  description = "The bucket's expiry rule: its id, an optional key prefix (null: the whole bucket), after how many days current versions expire (null: never) and after how many days noncurrent versions expire."
  type = object({
    id              = string
    prefix          = optional(string)
    current_days    = optional(number)
    noncurrent_days = number
  })
}

variable "abort_incomplete_upload_days" {
  description = "Days after which an incomplete multipart upload is aborted and its parts deleted."
  type        = number
}

variable "access_log" {
  description = "Where this bucket's server access logs go: the log bucket's name and a key prefix (e.g. data/). null for none: the log bucket itself."
  type = object({
    bucket = string
    prefix = string
  })
  default = null
}

variable "policy_documents" {
  description = "Policy documents (JSON) whose statements the bucket policy grants besides denying plain HTTP, e.g. S3 log delivery into the access-log bucket."
  type        = list(string)
  default     = []
}
