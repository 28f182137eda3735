# The variables every test run starts from (terraform test reads this file; a run's own
# `variables` block overrides them). The data bucket is adopted: the default.
vpc_id                  = "vpc-0123456789abcdef0"
private_subnet_ids      = ["subnet-aaa", "subnet-bbb"]
db_host                 = "toborverse-dev.cluster-abc.us-west-2.rds.amazonaws.com"
db_name                 = "toborverse"
db_user                 = "app_user"
db_cluster_resource_id  = "cluster-ABCDEFGHIJKLMNOP"
db_security_group_id    = "sg-0bbbbbbbbbbbbbbbb"
alert_emails            = ["oncall@example.com", "lead@example.com"]
webserver_ingress_cidrs = ["10.8.0.0/16"]
data_bucket_name        = "toborverse-dev-data"
