CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '${db_password}';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '${db_password}';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '${db_password}';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '${db_password}';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
