"""The devheal controller: cluster cache, findings, engine, actuators, leader election, metrics."""
