# The project's two images (Dockerfile), each in its repository, pushed by
# .github/workflows/deploy.yml as :latest and :<git sha>: `run` (the Dockerfile's default target:
# code server, daemon, run workers, transcode and dlq tasks; what every episode's cold start
# pulls) in <prefix>, and `webserver` (the same with the UI) in <prefix>-webserver
# (docs/deploy-aws.md#image-size). Only the three most recent images of each are kept, as the
# replaced worker's deploy did.

locals {
  image_repositories = {
    run       = local.prefix
    webserver = "${local.prefix}-webserver"
  }
}

resource "aws_ecr_repository" "image" {
  #checkov:skip=CKV_AWS_51:Tags must be mutable: each deploy moves :latest, which the task definitions use (the replaced worker's contract); :<sha> tags are never reused.
  for_each = local.image_repositories

  name                 = each.value
  image_tag_mutability = "MUTABLE"

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
  }
}

resource "aws_ecr_lifecycle_policy" "image" {
  for_each = aws_ecr_repository.image

  repository = each.value.name

  policy = jsonencode({
    rules = [
      {
        rulePriority = 1
        description  = "Keep the three most recent images"
        selection = {
          tagStatus   = "any"
          countType   = "imageCountMoreThan"
          countNumber = 3
        }
        action = {
          type = "expire"
        }
      }
    ]
  })
}

# The run image's repository was the stack's one repository: it keeps its state.
moved {
  from = aws_ecr_repository.app
  to   = aws_ecr_repository.image["run"]
}

moved {
  from = aws_ecr_lifecycle_policy.app
  to   = aws_ecr_lifecycle_policy.image["run"]
}
