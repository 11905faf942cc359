module example.com/vulncanary

go 1.22

require golang.org/x/net v0.22.0

require golang.org/x/text v0.14.0 // indirect
