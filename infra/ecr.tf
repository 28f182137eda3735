# The one image of the project (Dockerfile), pushed by .github/workflows/deploy.yml as :latest and
# :<git sha>. Only the three most recent images are kept, as the replaced worker's deploy did.

resource "aws_ecr_repository" "app" {
  #checkov:skip=CKV_AWS_51:Tags must be mutable: each deploy moves :latest, which the task definitions use (the replaced worker's contract); :<sha> tags are never reused.
  name                 = local.prefix
  image_tag_mutability = "MUTABLE"

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
  }
}

resource "aws_ecr_lifecycle_policy" "app" {
  repository = aws_ecr_repository.app.name

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
