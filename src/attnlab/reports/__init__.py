"""Reports over run directories: comparison tables across seeds, statistics and plots."""
