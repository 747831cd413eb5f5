module webhookstub

go 1.22
