"""What every running part of mm2py stands on, below the daemon and the cluster: the part
lifecycle, its scheduler, metrics, cluster reachability and the status models."""
