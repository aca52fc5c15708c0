"""Maintenance and operator services: the reaper, schedule firing, the hint dispatcher,
retention, operator actions. Each decides here and writes through the storage driver."""
